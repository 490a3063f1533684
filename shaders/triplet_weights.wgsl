// PML's TripletMarginLoss over one block of anchors, as weights for its gradient: for every
// anchor row of the block's distance matrix, the loss's sums and U, the weight of each
// (anchor, reference) pair that loss_backward.wgsl multiplies with the embeddings.
//
//   W[a, j] = dL/dD[a, j] before the mean's division: for a positive p, dp * sum over the
//             negatives n whose triplet (a, p, n) is kept and has a positive loss of the
//             loss's slope; for a negative n, -dp * the same sum over the positives
//             (dp = +1 for distances, -1 for similarities)
//   u[a * refs + j] = U: W / D (Euclidean; W / |q^ - r^| recomputed from the rows where D
//             is below the cancellation threshold NEAR, 0 where that is 0), 2 W (squared
//             Euclidean), W (cosine, dot product)
//   totals[8 (row0 + a) ..] = loss sum (f32 bits), then the positive losses and the kept
//             triplets, each as a 64-bit count (low word, high word), then three zeros
//
// A triplet (a, p, n): label[p] == label[a] != label[n], p not the anchor's own slot. It is
// kept when the miner rule (params.mode: common/margin.wgsl's `keeps`) accepts
// tm = an - ap (ap - an for similarities), and its loss is relu (or softplus) of PML's f32
// violation (ap - an) + margin ((an - ap) + margin for similarities).
//
// Three entry points, WORKGROUP_SIZE (256, set from Rust) invocations each:
//   split:  one workgroup per anchor: its positive columns, ascending, into the first slots of
//           its `lists` row, its negative columns into the last slots (descending), the
//           anchor's own column (if any) between them, the counts in the row's two header
//           words. Block by block, with one workgroup scan per block.
//   main:   one workgroup per (anchor, block of WORKGROUP_SIZE slots): each invocation owns
//           one slot's column and walks the other role's columns, staged through workgroup
//           memory, summing its triplets' slopes; so a positive meets only negatives and the
//           work is 2 P N per anchor, spread over the row's blocks. It writes U for its column
//           and the block's partial sums.
//   reduce: one workgroup per anchor: the partial sums of its blocks, in block order.
// Loops have the same trip count on every invocation of a workgroup (bounds from params or
// workgroupUniformLoad), so barriers stay uniform; workgroup indices fold y into x.

struct Params {
    anchors: u32,
    refs: u32,
    dim4: u32,
    // A METRIC_* code (common/metric.wgsl).
    metric: u32,
    normalize: u32,
    // The miner rule: a RULE_* code (common/margin.wgsl).
    mode: u32,
    miner_margin: f32,
    margin: f32,
    // 1: softplus (PML smooth_loss), 0: relu.
    softplus: u32,
    // Below this share of |q^|^2 + |r^|^2, D^2 has lost its digits to cancellation.
    near: f32,
    // The block's first anchor in `totals`.
    row0: u32,
    // The largest violation whose softplus is 0 in f32 with subnormals (set from Rust, from
    // the host's exp): below it a triplet's loss is not positive. Devices may flush the
    // subnormal losses above it to 0, which would drop them from the mean's count.
    softplus_floor: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) distances, row-major.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
// Per anchor refs + 2 words: positives, negatives, then refs slots of columns (see split).
@group(0) @binding(2) var<storage, read_write> lists: array<u32>;
// The block's anchor rows and every reference row, padded to vec4, unnormalised, with their
// squared norms (row_norms.wgsl).
@group(0) @binding(3) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(6) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(7) var<storage, read_write> u: array<f32>;
// 8 words per (anchor, block): main's partial sums, laid out as `totals`.
@group(0) @binding(8) var<storage, read_write> partials: array<u32>;
@group(0) @binding(9) var<storage, read_write> totals: array<u32>;
// refs reference labels, then per anchor its label and the slot of its own row (0xFFFFFFFF:
// none).
@group(0) @binding(10) var<storage, read> labels: array<u32>;

// Invocations per workgroup: set from Rust (triplet_weights::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

const NONE: u32 = 0u;
const POSITIVE: u32 = 1u;
const NEGATIVE: u32 = 2u;

var<workgroup> scan: array<vec2<u32>, WORKGROUP_SIZE>;
var<workgroup> tile_value: array<f32, WORKGROUP_SIZE>;
var<workgroup> counts: vec2<u32>;
var<workgroup> sum_loss: array<f32, WORKGROUP_SIZE>;
var<workgroup> sum_count: array<vec2<u32>, WORKGROUP_SIZE>;
var<workgroup> sum_items: array<vec2<u32>, WORKGROUP_SIZE>;

// The loss of violation v, its slope, and 1 where the loss is positive: relu (torch's: slope
// 0 at 0) or softplus (torch's, threshold 20; positive above params.softplus_floor however
// small).
fn hinge(v: f32) -> vec3<f32> {
    if (params.softplus == 0u) {
        if (v > 0.0) {
            return vec3<f32>(v, 1.0, 1.0);
        }
        return vec3<f32>(0.0);
    }
    if (v > 20.0) {
        return vec3<f32>(v, 1.0, 1.0);
    }
    if (v <= params.softplus_floor) {
        return vec3<f32>(0.0);
    }
    let z = exp(v);
    return vec3<f32>(log1p(z), z / (z + 1.0), 1.0);
}

fn violation(ap: f32, an: f32) -> f32 {
    if (is_similarity(params.metric)) {
        return (an - ap) + params.margin;
    }
    return (ap - an) + params.margin;
}

// 64-bit counts as (low, high) words.
fn add64(x: vec2<u32>, y: vec2<u32>) -> vec2<u32> {
    let lo = x.x + y.x;
    return vec2<u32>(lo, x.y + y.y + select(0u, 1u, lo < x.x));
}

// Sums the workgroup's (loss, count, items) into element 0 of the sum arrays.
fn reduce_sums(t: u32, loss: f32, count: vec2<u32>, items: vec2<u32>) {
    sum_loss[t] = loss;
    sum_count[t] = count;
    sum_items[t] = items;
    for (var half = WORKGROUP_SIZE / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (t < half) {
            sum_loss[t] += sum_loss[t + half];
            sum_count[t] = add64(sum_count[t], sum_count[t + half]);
            sum_items[t] = add64(sum_items[t], sum_items[t + half]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn split(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = wid.x + wid.y * groups.x;
    // Uniform per workgroup: a whole workgroup leaves together, so barriers below stay valid.
    if (a >= params.anchors) {
        return;
    }
    let t = lid.x;
    let m = params.refs;
    let base = a * (m + 2u) + 2u;
    let label = labels[m + 2u * a];
    let me = labels[m + 2u * a + 1u];
    var before = vec2<u32>(0u, 0u);
    for (var j0 = 0u; j0 < m; j0 += WORKGROUP_SIZE) {
        let j = j0 + t;
        var flags = vec2<u32>(0u, 0u);
        if (j < m) {
            if (labels[j] != label) {
                flags = vec2<u32>(0u, 1u);
            } else if (j != me) {
                flags = vec2<u32>(1u, 0u);
            }
        }
        // Inclusive scan of (positive, negative) flags over the block.
        workgroupBarrier();
        scan[t] = flags;
        for (var off = 1u; off < WORKGROUP_SIZE; off *= 2u) {
            workgroupBarrier();
            var v = scan[t];
            if (t >= off) {
                v += scan[t - off];
            }
            workgroupBarrier();
            scan[t] = v;
        }
        workgroupBarrier();
        let at = before + scan[t] - flags;
        if (flags.x == 1u) {
            lists[base + at.x] = j;
        } else if (flags.y == 1u) {
            lists[base + m - 1u - at.y] = j;
        }
        before += scan[WORKGROUP_SIZE - 1u];
    }
    if (t == 0u) {
        lists[base - 2u] = before.x;
        lists[base - 1u] = before.y;
        // The anchor's own column, neither role, in the one slot between them.
        if (before.x + before.y < m) {
            lists[base + before.x] = me;
        }
    }
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let m = params.refs;
    let blocks = (m + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
    let g = wid.x + wid.y * groups.x;
    let a = g / blocks;
    let block = g % blocks;
    // Uniform per workgroup: a whole workgroup leaves together, so barriers below stay valid.
    if (a >= params.anchors) {
        return;
    }
    let t = lid.x;
    let row = a * m;
    let base = a * (m + 2u) + 2u;
    if (t == 0u) {
        counts = vec2<u32>(lists[base - 2u], lists[base - 1u]);
    }
    let n = workgroupUniformLoad(&counts);
    let positives = n.x;
    let first_negative = m - n.y;
    let dp = select(1.0, -1.0, is_similarity(params.metric));

    // This invocation's slot: a positive, a negative, or the anchor's own column.
    let first = block * WORKGROUP_SIZE;
    let slot = first + t;
    var mine = NONE;
    var col = 0u;
    var value = 0.0;
    if (slot < m) {
        col = lists[base + slot];
        value = distances[row + col];
        if (slot < positives) {
            mine = POSITIVE;
        } else if (slot >= first_negative) {
            mine = NEGATIVE;
        }
    }

    var loss = 0.0;
    // Kahan compensation of the loss sum.
    var lost = 0.0;
    var kept = 0u;
    var positive = 0u;
    var slopes = 0.0;
    // Positives of this block against every negative.
    if (first < positives) {
        for (var k0 = first_negative; k0 < m; k0 += WORKGROUP_SIZE) {
            workgroupBarrier();
            let k = k0 + t;
            if (k < m) {
                tile_value[t] = distances[row + lists[base + k]];
            }
            workgroupBarrier();
            if (mine == POSITIVE) {
                let span = min(WORKGROUP_SIZE, m - k0);
                for (var i = 0u; i < span; i++) {
                    let an = tile_value[i];
                    if (keeps(params.mode, params.miner_margin, value, an, is_similarity(params.metric))) {
                        kept += 1u;
                        let h = hinge(violation(value, an));
                        if (h.z > 0.0) {
                            positive += 1u;
                            slopes += h.y;
                            let y = h.x - lost;
                            let s = loss + y;
                            lost = (s - loss) - y;
                            loss = s;
                        }
                    }
                }
            }
        }
    }
    // Negatives of this block against every positive.
    if (n.y > 0u && first + WORKGROUP_SIZE > first_negative && first < m) {
        for (var k0 = 0u; k0 < positives; k0 += WORKGROUP_SIZE) {
            workgroupBarrier();
            let k = k0 + t;
            if (k < positives) {
                tile_value[t] = distances[row + lists[base + k]];
            }
            workgroupBarrier();
            if (mine == NEGATIVE) {
                let span = min(WORKGROUP_SIZE, positives - k0);
                for (var i = 0u; i < span; i++) {
                    let ap = tile_value[i];
                    if (keeps(params.mode, params.miner_margin, ap, value, is_similarity(params.metric))) {
                        let h = hinge(violation(ap, value));
                        if (h.z > 0.0) {
                            slopes += h.y;
                        }
                    }
                }
            }
        }
    }
    if (slot < m) {
        var w = 0.0;
        if (mine == POSITIVE) {
            w = dp * slopes;
        } else if (mine == NEGATIVE) {
            w = -dp * slopes;
        }
        u[row + col] = pair_weight(a, col, w, value);
    }

    reduce_sums(t, loss, vec2<u32>(positive, 0u), vec2<u32>(kept, 0u));
    if (t == 0u) {
        let at = 8u * (a * blocks + block);
        let c = sum_count[0];
        let k = sum_items[0];
        partials[at] = bitcast<u32>(sum_loss[0]);
        partials[at + 1u] = c.x;
        partials[at + 2u] = c.y;
        partials[at + 3u] = k.x;
        partials[at + 4u] = k.y;
    }
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn reduce(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let a = wid.x + wid.y * groups.x;
    // Uniform per workgroup: a whole workgroup leaves together, so barriers below stay valid.
    if (a >= params.anchors) {
        return;
    }
    let t = lid.x;
    let blocks = (params.refs + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
    var loss = 0.0;
    var count = vec2<u32>(0u, 0u);
    var items = vec2<u32>(0u, 0u);
    for (var block = t; block < blocks; block += WORKGROUP_SIZE) {
        let at = 8u * (a * blocks + block);
        loss += bitcast<f32>(partials[at]);
        count = add64(count, vec2<u32>(partials[at + 1u], partials[at + 2u]));
        items = add64(items, vec2<u32>(partials[at + 3u], partials[at + 4u]));
    }
    reduce_sums(t, loss, count, items);
    if (t == 0u) {
        let c = sum_count[0];
        let k = sum_items[0];
        let at = 8u * (params.row0 + a);
        totals[at] = bitcast<u32>(sum_loss[0]);
        totals[at + 1u] = c.x;
        totals[at + 2u] = c.y;
        totals[at + 3u] = k.x;
        totals[at + 4u] = k.y;
        totals[at + 5u] = 0u;
        totals[at + 6u] = 0u;
        totals[at + 7u] = 0u;
    }
}
