// Per query row: the k best of (its running best list) ∪ (one block of scores against a range of
// references), by exact radix selection. One workgroup per row; any k.
//
// Order: every score becomes a key, a u32 whose unsigned order is "better first" (smaller
// distance, or larger similarity), with -0 folded onto +0 so equal scores get equal keys. Ties
// go to the lower reference index, so the selected set is exactly the first k of the row
// sorted by (key, index), whatever the order elements are visited in.
//
// Selection: a radix select over the keys, 8 bits per pass from the top, histogramming only the
// elements whose higher digits equal the digits chosen so far, finds the k-th key T and how
// many elements equal to T are needed; if more elements equal T than are needed, the same
// select over their indices finds the largest index to take. It stops early as soon as a whole
// bin is taken. Elements worse than the running list's worst key can never enter (k better ones
// exist already), so a full running list filters them out of every pass. Each pass's bin is
// found by a parallel scan of the histogram (every invocation sums a slice), not by one
// invocation walking 256 bins while the others wait.
//
// Output: the k selected (key, index) pairs of the row in no particular order (the host sorts the
// final lists), and when fewer than k elements exist the remaining slots hold EMPTY_INDEX.
// `best_in` slots with an index of EMPTY_INDEX or above are not elements. A reference whose
// global index equals the row's `excluded` entry (the query itself) is skipped.

struct Params {
    rows: u32,
    // Columns of the block and the block buffer's row length.
    cols: u32,
    block_stride: u32,
    k: u32,
    // Slots of best_in per row that hold elements (0 for the first block, else k).
    best_len: u32,
    // Global reference index of block column 0.
    col_base: u32,
    // 1: larger scores are better (similarities).
    largest: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> block: array<f32>;
@group(0) @binding(2) var<storage, read> best_in: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> excluded: array<u32>;
@group(0) @binding(4) var<storage, read_write> best_out: array<vec2<u32>>;

// Invocations per workgroup, and the index of an empty slot: set from Rust
// (knn_select::WORKGROUP_SIZE, knn_select::EMPTY_INDEX).
override WORKGROUP_SIZE: u32;
override EMPTY_INDEX: u32;
const EMPTY_KEY: u32 = 0xFFFFFFFFu;

var<workgroup> histogram: array<atomic<u32>, 256>;
// Per-invocation sums of the histogram's slices, scanned by `choose` (WORKGROUP_SIZE divides
// 256, checked in Rust).
var<workgroup> partial: array<u32, 256>;
var<workgroup> threshold: atomic<u32>;
var<workgroup> running: atomic<u32>;
var<workgroup> written: atomic<u32>;
// The selection state, written by invocation 0 between passes.
var<workgroup> prefix: u32;
var<workgroup> mask: u32;
var<workgroup> want: u32;
// 0: refining; 1: take keys whose masked digits are <= prefix (done); 2: ties on the full key
// need the index select; 3: done with ties resolved by index (take index <= index_limit).
var<workgroup> mode: u32;
var<workgroup> index_prefix: u32;
var<workgroup> index_mask: u32;

fn key_of(score: f32) -> u32 {
    var s = score;
    if (params.largest != 0u) {
        s = -s;
    }
    var b = bitcast<u32>(s);
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

struct Element {
    key: u32,
    index: u32,
    // false for empty running slots and for the excluded reference.
    valid: bool,
}

// Element e of the row: running slots first, then the block's columns. `skip` is the row's
// excluded reference index.
fn element(row: u32, e: u32, skip: u32) -> Element {
    if (e < params.best_len) {
        let entry = best_in[row * params.k + e];
        return Element(entry.x, entry.y, entry.y < EMPTY_INDEX);
    }
    let j = e - params.best_len;
    let index = params.col_base + j;
    return Element(key_of(block[row * params.block_stride + j]), index, index != skip);
}

// Every invocation calls this (it holds barriers): the invocations sum the histogram in
// slices of 256 / WORKGROUP_SIZE bins, scan the sums in parallel, and the one whose slice
// holds the bin where the cumulative count reaches `want` picks it and updates the state.
fn choose(lid: u32, shift: u32, by_index: bool) {
    let per = 256u / WORKGROUP_SIZE;
    let first = lid * per;
    // Read before the barriers below; only the invocation that picks writes it, after them.
    let wanted = want;
    var sum = 0u;
    for (var i = 0u; i < per; i++) {
        sum += atomicLoad(&histogram[first + i]);
    }
    partial[lid] = sum;
    workgroupBarrier();
    // Inclusive scan of the slice sums (Hillis-Steele: log2(WORKGROUP_SIZE) steps).
    for (var offset = 1u; offset < WORKGROUP_SIZE; offset <<= 1u) {
        var add = 0u;
        if (lid >= offset) {
            add = partial[lid - offset];
        }
        workgroupBarrier();
        partial[lid] += add;
        workgroupBarrier();
    }
    let inclusive = partial[lid];
    if (lid == WORKGROUP_SIZE - 1u && inclusive < wanted) {
        // Fewer elements than wanted (only in the first pass): take every one.
        mode = 1u;
        return;
    }
    var below = inclusive - sum;
    if (below >= wanted || inclusive < wanted) {
        return;
    }
    // The bin is in this invocation's slice.
    var bin = first;
    var count = 0u;
    for (var i = 0u; i < per; i++) {
        let h = atomicLoad(&histogram[first + i]);
        if (below + h >= wanted) {
            bin = first + i;
            count = h;
            break;
        }
        below += h;
    }
    want = wanted - below;
    if (by_index) {
        index_prefix |= bin << shift;
        index_mask |= 0xFFu << shift;
        if (count == want || shift == 0u) {
            mode = 3u;
            // Take indices up to the last one of this bin.
            index_prefix |= ~index_mask;
            index_mask = 0xFFFFFFFFu;
        }
        return;
    }
    prefix |= bin << shift;
    mask |= 0xFFu << shift;
    if (count == want) {
        mode = 1u;
    } else if (shift == 0u) {
        mode = 2u;
    }
}

fn taken(el: Element, limit: u32) -> bool {
    if (!el.valid || el.key > limit) {
        return false;
    }
    let digits = el.key & mask;
    if (mode == 1u) {
        return digits <= prefix;
    }
    // mode 3: every key below T, and the ties up to the index limit.
    return el.key < prefix || (el.key == prefix && el.index <= index_prefix);
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
    let count = params.best_len + params.cols;
    let skip = excluded[row];

    // The running list's worst key, if it is full.
    if (lid == 0u) {
        atomicStore(&threshold, 0u);
        atomicStore(&running, 0u);
        atomicStore(&written, 0u);
        prefix = 0u;
        mask = 0u;
        want = params.k;
        mode = 0u;
        index_prefix = 0u;
        index_mask = 0u;
    }
    workgroupBarrier();
    for (var e = lid; e < params.best_len; e += WORKGROUP_SIZE) {
        let el = element(row, e, skip);
        if (el.valid) {
            atomicMax(&threshold, el.key);
            atomicAdd(&running, 1u);
        }
    }
    workgroupBarrier();
    var limit = EMPTY_KEY;
    if (atomicLoad(&running) == params.k) {
        limit = atomicLoad(&threshold);
    }

    // Key digits, most significant first; then, if needed, index digits among the ties.
    for (var step = 0u; step < 8u; step++) {
        let state = workgroupUniformLoad(&mode);
        if (state == 1u || state == 3u || (state == 0u && step >= 4u)) {
            break;
        }
        let by_index = state == 2u;
        let shift = 24u - 8u * (step % 4u);
        for (var b = lid; b < 256u; b += WORKGROUP_SIZE) {
            atomicStore(&histogram[b], 0u);
        }
        workgroupBarrier();
        // Each invocation counts runs of one bin in a register and adds a run at once: the top
        // digit of keys of one row is nearly constant (scores of similar magnitude), and one
        // atomic per element would all hit the same bin.
        var run_bin = 256u;
        var run = 0u;
        for (var e = lid; e < count; e += WORKGROUP_SIZE) {
            let el = element(row, e, skip);
            if (!el.valid || el.key > limit) {
                continue;
            }
            var bin = 256u;
            if (by_index) {
                if (el.key == prefix && (el.index & index_mask) == index_prefix) {
                    bin = (el.index >> shift) & 0xFFu;
                }
            } else if ((el.key & mask) == prefix) {
                bin = (el.key >> shift) & 0xFFu;
            }
            if (bin == 256u) {
                continue;
            }
            if (bin == run_bin) {
                run += 1u;
            } else {
                if (run > 0u) {
                    atomicAdd(&histogram[run_bin], run);
                }
                run_bin = bin;
                run = 1u;
            }
        }
        if (run > 0u) {
            atomicAdd(&histogram[run_bin], run);
        }
        workgroupBarrier();
        choose(lid, shift, by_index);
        workgroupBarrier();
    }

    // Compaction: the members in any order, then EMPTY slots up to k.
    let base = row * params.k;
    for (var e = lid; e < count; e += WORKGROUP_SIZE) {
        let el = element(row, e, skip);
        if (taken(el, limit)) {
            let slot = atomicAdd(&written, 1u);
            best_out[base + slot] = vec2<u32>(el.key, el.index);
        }
    }
    workgroupBarrier();
    let filled = atomicLoad(&written);
    for (var s = filled + lid; s < params.k; s += WORKGROUP_SIZE) {
        best_out[base + s] = vec2<u32>(EMPTY_KEY, EMPTY_INDEX);
    }
}
