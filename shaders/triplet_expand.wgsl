// Triplet rows (anchor, positive, negative) from segments: segment s owns output rows
// starts[s] .. starts[s + 1], all with heads[s] = (anchor, positive), and takes their negatives
// in order from `source`, element sources[s] on. This is how mined triplets are written on the
// device: a segment is one (anchor, positive) pair and its run of negatives (the anchor's
// negative list for every valid triplet, the pair's kept negatives for a margin rule), so the
// `O(b·m²)` rows are expanded from `O(b·m)` lists without a trip to the host.
//
// One invocation per output row, over a 2-D grid of workgroups: it finds its segment by binary
// search over `starts` (ascending, starts[0] = 0, starts[segments] = rows) and writes its own
// three words, nothing else.

struct Params {
    // Segments in this dispatch (at least 1), and the output rows they own.
    segments: u32,
    rows: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> heads: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> sources: array<u32>;
@group(0) @binding(4) var<storage, read> source: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

// Invocations per workgroup: set from Rust (triplet_expand::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let t = (wid.y * groups.x + wid.x) * WORKGROUP_SIZE + lid;
    if (t >= params.rows) {
        return;
    }
    // starts[lo] <= t < starts[hi] throughout.
    var lo = 0u;
    var hi = params.segments;
    while (hi - lo > 1u) {
        let mid = lo + (hi - lo) / 2u;
        if (starts[mid] <= t) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let head = heads[lo];
    out[3u * t] = head.x;
    out[3u * t + 1u] = head.y;
    out[3u * t + 2u] = source[sources[lo] + (t - starts[lo])];
}
