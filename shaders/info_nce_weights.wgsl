// The InfoNCE family (PML's NTXentLoss, sentence-transformers' MultipleNegativesRankingLoss)
// over one block of anchors, as weights for its gradient: for every anchor row of the block's
// distance matrix, the loss's sums and U, the weight of each (anchor, reference) pair that
// loss_backward.wgsl multiplies with the embeddings.
//
// With logits z = dz * D (dz = +1/tau for similarities, -1/tau for distances), positives P
// (label[j] == label[a], j not the anchor's own slot) and negatives N (label[j] != label[a]),
// L = log sum_N e^{z_n}, each positive's loss is PML's -log(x + TINY) with x = sigmoid(z_p - L)
// (TINY: f32's smallest normal number), and
//
//   W[a, p] = -dz * flat_p * (1 - x_p),   flat_p = x_p / (x_p + TINY)
//   W[a, n] =  dz * e^{z_n - L} * sum_P flat_p * (1 - x_p)
//   u[a * refs + j] = U from W as in triplet_weights.wgsl (W / D, or from the rows when D is
//             below the cancellation threshold, for Euclidean; 2 W squared; W similarities)
//   totals[8 (row0 + a) ..] = the positives' loss sum (f32 bits), |P| and |N| as 64-bit
//             counts (low word, high word), then three zeros
//
// With no negative, x = 1 and nothing moves. One workgroup per anchor (y folded into x past
// 65 535), WORKGROUP_SIZE (256, set from Rust) invocations striding over the row: a maximum,
// two sums and the writes, each pass a uniform loop with workgroup reductions between.

struct Params {
    anchors: u32,
    refs: u32,
    dim4: u32,
    // A METRIC_* code (common/metric.wgsl).
    metric: u32,
    normalize: u32,
    // dL/dz's factor: +1/tau for similarities, -1/tau for distances.
    dz: f32,
    // Below this share of |q^|^2 + |r^|^2, D^2 has lost its digits to cancellation.
    near: f32,
    // The block's first anchor in `totals`.
    row0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// (anchors, refs) distances, row-major.
@group(0) @binding(1) var<storage, read> distances: array<f32>;
// refs reference labels, then per anchor its label and the slot of its own row (0xFFFFFFFF:
// none).
@group(0) @binding(2) var<storage, read> labels: array<u32>;
// The block's anchor rows and every reference row, padded to vec4, unnormalised, with their
// squared norms (row_norms.wgsl).
@group(0) @binding(3) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(6) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(7) var<storage, read_write> u: array<f32>;
@group(0) @binding(8) var<storage, read_write> totals: array<u32>;

// Invocations per workgroup: set from Rust (info_nce_weights::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

// PML's small_val: f32's smallest normal number.
const TINY: f32 = 1.17549435e-38;

var<workgroup> reduced: array<f32, WORKGROUP_SIZE>;
var<workgroup> counted: array<vec2<u32>, WORKGROUP_SIZE>;

// log(e^x + e^y) without overflow or underflow.
fn log_add_exp(x: f32, y: f32) -> f32 {
    return max(x, y) + log1p(exp(-abs(x - y)));
}

// A positive's loss -log(x + TINY) and the flattening x / (x + TINY) of its derivative, from
// log x: in logs, so that an x below f32's normal range (which a device may flush to 0)
// still counts as the host's f64 has it.
fn positive_terms(log_x: f32) -> vec2<f32> {
    let log_tiny = log(TINY);
    return vec2<f32>(-log_add_exp(log_x, log_tiny), sigmoid(log_x - log_tiny));
}

// The workgroup's maximum (op 0) or sum (op 1) of v, on every invocation.
fn combine(t: u32, v: f32, op: u32) -> f32 {
    workgroupBarrier();
    reduced[t] = v;
    for (var half = WORKGROUP_SIZE / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (t < half) {
            if (op == 0u) {
                reduced[t] = max(reduced[t], reduced[t + half]);
            } else {
                reduced[t] += reduced[t + half];
            }
        }
    }
    return workgroupUniformLoad(&reduced[0]);
}

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
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
    let row = a * m;
    let dz = params.dz;

    // The negatives' largest logit, then L = top + log sum_N e^{z_n - top}.
    var top = -3.40282347e38;
    var negatives = 0u;
    var positives = 0u;
    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        let r = role(a, j);
        if (r == ROLE_NEGATIVE) {
            top = max(top, dz * distances[row + j]);
            negatives += 1u;
        } else if (r == ROLE_POSITIVE) {
            positives += 1u;
        }
    }
    top = combine(t, top, 0u);
    var sum = 0.0;
    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        if (role(a, j) == ROLE_NEGATIVE) {
            sum += exp(dz * distances[row + j] - top);
        }
    }
    sum = combine(t, sum, 1u);
    let any_negative = sum > 0.0;
    let log_sum = top + log(sum);

    // Positives: their losses and weights, and what every negative's weight shares.
    var loss = 0.0;
    var on_negatives = 0.0;
    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        if (role(a, j) == ROLE_POSITIVE) {
            // log x = log sigmoid(z - L) = -log(1 + e^{L - z}); 0 without a negative.
            var log_x = 0.0;
            var rest = 0.0;
            if (any_negative) {
                let z = dz * distances[row + j];
                log_x = -log_add_exp(0.0, log_sum - z);
                rest = sigmoid(log_sum - z);
            }
            let terms = positive_terms(log_x);
            loss += terms.x;
            on_negatives += terms.y * rest;
        }
    }
    on_negatives = combine(t, on_negatives, 1u);
    loss = combine(t, loss, 1u);

    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        let d = distances[row + j];
        let r = role(a, j);
        var w = 0.0;
        if (r == ROLE_POSITIVE && any_negative) {
            let z = dz * d;
            let flat = positive_terms(-log_add_exp(0.0, log_sum - z)).y;
            w = -dz * flat * sigmoid(log_sum - z);
        } else if (r == ROLE_NEGATIVE) {
            w = dz * exp(dz * d - log_sum) * on_negatives;
        }
        u[row + j] = pair_weight(a, j, w, d);
    }

    // The counts: |P| and |N| of this anchor.
    workgroupBarrier();
    counted[t] = vec2<u32>(positives, negatives);
    for (var half = WORKGROUP_SIZE / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (t < half) {
            counted[t] = counted[t] + counted[t + half];
        }
    }
    workgroupBarrier();
    if (t == 0u) {
        let at = 8u * (params.row0 + a);
        let c = counted[0];
        totals[at] = bitcast<u32>(loss);
        totals[at + 1u] = c.x;
        totals[at + 2u] = 0u;
        // Negatives count where there is a positive (the native path's items).
        totals[at + 3u] = select(0u, c.y, c.x > 0u);
        totals[at + 4u] = 0u;
        totals[at + 5u] = 0u;
        totals[at + 6u] = 0u;
        totals[at + 7u] = 0u;
    }
}
