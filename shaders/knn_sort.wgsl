// Per row of a buffer of best lists ((key, index) slots, k per row, in no particular order: what
// knn_select leaves): sorts the row in place by (key, index), best first, and writes its
// indices and scores to the rows of two output arrays. One workgroup per row; any k.
//
// Sort: a bitonic network in its "flip, then disperse" form, in which every compare-exchange puts
// the smaller slot at the lower position. A row of k slots therefore sorts as if it were padded to
// the next power of two with slots larger than any: a pair whose upper position is k or more is
// skipped (the missing slot would stay where it is). The row is sorted where it lies, in storage
// memory, with a storageBarrier() after every step; the loop bounds are uniform, so every
// invocation reaches every barrier.
//
// Keys are knn_select's (unsigned order is "better first"); ties on the key go to the lower index,
// and empty slots (index EMPTY_INDEX, key 0xFFFFFFFF) sort last, so a sorted row is exactly what
// the host's sort gives. A score is its key mapped back (empty slots: NaN).

struct Params {
    rows: u32,
    k: u32,
    // 1: larger scores are better (similarities); the keys were negated scores.
    largest: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> lists: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> indices: array<u32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;

// Invocations per workgroup, and the index of an empty slot: set from Rust
// (knn_sort::WORKGROUP_SIZE, knn_select::EMPTY_INDEX).
override WORKGROUP_SIZE: u32;
override EMPTY_INDEX: u32;

fn before(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

// Orders slots i < j of the row at `base`: the smaller one ends at i.
fn exchange(base: u32, i: u32, j: u32) {
    let a = lists[base + i];
    let b = lists[base + j];
    if (before(b, a)) {
        lists[base + i] = b;
        lists[base + j] = a;
    }
}

// The inverse of knn_select's key_of (-0 came in as +0).
fn score_of(key: u32) -> f32 {
    var bits = ~key;
    if ((key & 0x80000000u) != 0u) {
        bits = key & 0x7FFFFFFFu;
    }
    // Similarities were negated: flip the sign bit back, exactly (no arithmetic, so no
    // flushed denormals), as the host's `0.0 - s` does, which leaves +0 as +0 and a NaN as it
    // is.
    let nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    if (params.largest != 0u && bits != 0u && !nan) {
        bits ^= 0x80000000u;
    }
    return bitcast<f32>(bits);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let row = wid.y * groups.x + wid.x;
    // Whole workgroups leave together, so every barrier below is reached by all or none.
    if (row >= params.rows) {
        return;
    }
    let n = params.k;
    let base = row * n;
    // Blocks of `size` slots, doubling while a block's lower half is shorter than the row.
    for (var size = 2u; (size >> 1u) < n; size <<= 1u) {
        let half = size >> 1u;
        // Flip: slot `off` of a block against slot `size - 1 - off` of the same block.
        let flips = ((n + size - 1u) / size) * half;
        for (var t = lid; t < flips; t += WORKGROUP_SIZE) {
            let start = (t / half) * size;
            let off = t % half;
            let j = start + size - 1u - off;
            if (j < n) {
                exchange(base, start + off, j);
            }
        }
        storageBarrier();
        // Disperse: slot `off` of a block of 2·d against slot `off + d`, d halving to 1.
        for (var d = half >> 1u; d > 0u; d >>= 1u) {
            let pairs = ((n + 2u * d - 1u) / (2u * d)) * d;
            for (var t = lid; t < pairs; t += WORKGROUP_SIZE) {
                let i = (t / d) * 2u * d + t % d;
                if (i + d < n) {
                    exchange(base, i, i + d);
                }
            }
            storageBarrier();
        }
    }
    for (var s = lid; s < n; s += WORKGROUP_SIZE) {
        let slot = lists[base + s];
        indices[base + s] = slot.y;
        if (slot.y >= EMPTY_INDEX) {
            scores[base + s] = bitcast<f32>(0x7FC00000u);
        } else {
            scores[base + s] = score_of(slot.x);
        }
    }
}
