// PML's pair losses (src/ops/loss/pair_rules.rs has each rule's formula) over one block of
// anchors, as weights for their gradient: for every anchor row of the block's distance matrix,
// the rule's sums and U, the weight of each (anchor, reference) pair that loss_backward.wgsl
// multiplies with the embeddings. One skeleton, every rule a few pieces of it:
//
//   1. over the row: |P| and |N| (P: label[j] == label[a], j not the anchor's own slot; N:
//      label[j] != label[a]) and the maxima of the rule's logit over P, over N, and over
//      every column (SupCon's row maximum);                                   `logit`
//   2. over the row: four sums and four counts, from the maxima;             `part`
//   3. once per anchor: its words and the factors of its weights; `anchor_words`, `factors`
//      (FastAP first bins the row: `fast_ap_bins`; Histogram's first pass: `histogram_bins`)
//   4. over the row: W = dL/dD for each pair, then U as loss_backward takes it. `weight`
//
// The rules (codes PAIR_*, set from Rust), with `margin(x, y)` = x - y for distances and
// y - x for similarities, and `first` = dmargin(D, .)/dD (+1 for distances, -1 for
// similarities):
//   CONTRASTIVE (p0 pos_margin, p1 neg_margin, p2 1/|nonzero P pairs|, p3 1/|nonzero N pairs|)
//   MULTI_SIMILARITY (p0 alpha, p1 beta, p2 base), SUPCON (p0 temperature),
//   CIRCLE (p0 m, p1 gamma), NCA (p0 softmax_scale), GENERALIZED_LIFTED (p0, p1 margins),
//   MARGIN (p0 margin, p1 beta), FAST_AP (p0 the bins' width, `edges` bins),
//   THRESHOLD_CONSISTENT (p0 m+, p1 m-, p2 lambda+ / |P kept|, p3 lambda- / |N kept|),
//   LIFTED (p0, p1 margins; the state: every query row's log S, LOWEST where it has no
//   negative), HISTOGRAM (p0 the nodes' spacing, `edges` nodes; the state: the loss's
//   derivatives by positive node and by negative node, each divided by the spacing and its
//   histogram's pair count, then a flag per query row: its class has a positive),
//   RANKED_LIST (p0 the positives' boundary alpha - margin, p1 the negatives' alpha, p2 T_p,
//   p3 T_n, p4 imbalance), INTRA_PAIR_VARIANCE (`edges` the pass: 0 sums the distances, 1
//   the hinges, 2 the squares and the weights; per group (P: p0, p1, p4, p6; N: p2, p3, p5,
//   p7) the hinge's slope a and offset b mu, 2 / |group| and b times the hinges' mean),
//   SOFTMAX (the losses with class weights, src/ops/loss/classifier_device.rs: one reference
//   per class, the anchor's class its one positive; logits p0 psi(c) on the positive, p0 c
//   elsewhere, a cross entropy that drops no anchor; psi: p5 0 shifts by p1 (CosFace), p5 1
//   is ArcFace's with p2 the margin m in radians, p3 the least f32 cosine the native path
//   takes as theta <= pi - m (about -cos m; taken from there up),
//   p4 1 for PML's slope through acos, 0 for insightface's straight one, p6 cos m, p7 sin m).
// Contrastive and TCM divide by counts over every anchor: a first pass with `forward` set
// counts them (U untouched), the second takes the weights already divided. Lifted's first
// pass gives each row its log S, Histogram's its histograms; their second passes read them
// back, gathered, from the state. Lifted and Histogram run with the queries as references.
//
//   totals[stride (row0 + a) ..] = three f32 words (the loss, or the sums the host combines:
//             see src/ops/loss/pair_device.rs), four counts, a zero; Histogram's first pass
//             then its (positive, negative) histograms, node by node
//
// One workgroup per anchor (y folded into x past 65 535), WORKGROUP_SIZE (256, set from
// Rust) invocations striding over the row, each stage a uniform loop with workgroup
// reductions between: no barrier is ever behind a condition that differs in a workgroup.

struct Params {
    anchors: u32,
    refs: u32,
    dim4: u32,
    // A METRIC_* code (common/metric.wgsl).
    metric: u32,
    normalize: u32,
    // Below this share of |q^|^2 + |r^|^2, D^2 has lost its digits to cancellation.
    near: f32,
    // The block's first anchor in `totals`.
    row0: u32,
    // A PAIR_* code.
    rule: u32,
    // 1: the words only, U left as it is.
    forward: u32,
    // FastAP's bins (num_bins + 1, at most MAX_EDGES).
    edges: u32,
    // Where the rule's state starts in `labels` (Lifted, Histogram).
    state0: u32,
    // Words per anchor in `totals`: 8, and Histogram's two histograms.
    stride: u32,
    // The rule's parameters (above).
    p0: f32,
    p1: f32,
    p2: f32,
    p3: f32,
    p4: f32,
    p5: f32,
    p6: f32,
    p7: f32,
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

// Invocations per workgroup: set from Rust (pair_weights::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

const PAIR_CONTRASTIVE: u32 = 0u;
const PAIR_MULTI_SIMILARITY: u32 = 1u;
const PAIR_SUPCON: u32 = 2u;
const PAIR_CIRCLE: u32 = 3u;
const PAIR_NCA: u32 = 4u;
const PAIR_GENERALIZED_LIFTED: u32 = 5u;
const PAIR_MARGIN: u32 = 6u;
const PAIR_FAST_AP: u32 = 7u;
const PAIR_THRESHOLD_CONSISTENT: u32 = 8u;
const PAIR_LIFTED: u32 = 9u;
const PAIR_HISTOGRAM: u32 = 10u;
const PAIR_RANKED_LIST: u32 = 11u;
const PAIR_INTRA_PAIR_VARIANCE: u32 = 12u;
const PAIR_SOFTMAX: u32 = 13u;
// FastAP's most bins (pair_weights::MAX_EDGES).
const MAX_EDGES: u32 = 256u;

// The maxima's start: below every logit (an empty group keeps it, and is never read).
const LOWEST: f32 = -3.40282347e38;
// ln 2^-150, half f32's smallest subnormal: a probability at or below e^this rounds to 0 in
// f32 (the native path's test), whether or not the device keeps subnormals.
const LOG_ZERO: f32 = -103.972;
// ArcFace's floor of sin(theta) in PML's slope sin(theta + m) / sin(theta): its value at the
// f32 cosine next to 1 (src/ops/loss/classifier_params.rs, SIN_FLOOR).
const SIN_FLOOR: f32 = 3.4526696e-4;

// SOFTMAX's target margin at the cosine c: (psi(c), dpsi/dc), as the native path's `margin`.
// ArcFace's cos(theta + m) and sin(theta + m) by their sums, without acos: WGSL leaves acos's
// accuracy to the vendor (1e-4 off on lavapipe), where products and sqrt keep f32's.
fn target_margin(c: f32) -> vec2<f32> {
    if (params.p5 == 0.0) {
        return vec2<f32>(c - params.p1, 1.0);
    }
    let m = params.p2;
    let cos_m = params.p6;
    let sin_m = params.p7;
    // PML: theta = acos(clamp(c, -1, 1)), whose gradient vanishes past +-1.
    let inside = abs(c) <= 1.0;
    let k = clamp(c, -1.0, 1.0);
    // (1 - k)(1 + k): 1 - k^2 loses sin(theta)'s digits near k = 1.
    let sin_t = sqrt(max((1.0 - k) * (1.0 + k), 0.0));
    if (k >= params.p3) {
        var slope = 1.0;
        if (params.p4 != 0.0) {
            slope = select(0.0, (sin_t * cos_m + k * sin_m) / max(sin_t, SIN_FLOOR), inside);
        }
        return vec2<f32>(k * cos_m - sin_t * sin_m, slope);
    }
    return vec2<f32>(k - m * sin_m, select(0.0, 1.0, inside || params.p4 == 0.0));
}

// The anchor (its row among the call's queries) and the column an invocation is at: what
// Lifted's and Histogram's state is indexed by (the references are the queries there).
var<private> anchor_row: u32;
var<private> column: u32;

// Word i of the rule's state, as a float and as a count.
fn state_f32(i: u32) -> f32 {
    return bitcast<f32>(labels[params.state0 + i]);
}

fn state_u32(i: u32) -> u32 {
    return labels[params.state0 + i];
}

// Lifted: log(S_a + S_p) from the rows' log S (LOWEST: a row without a negative, S = 0); 0
// where both are (PML's masked fill).
fn lifted_lse(x: f32, y: f32) -> f32 {
    if (x == LOWEST && y == LOWEST) {
        return 0.0;
    }
    if (x == LOWEST || y == LOWEST) {
        return max(x, y);
    }
    return max(x, y) + log1p(exp(-abs(x - y)));
}

// Lifted's positive pair (anchor, column) at distance d: relu(log(S_a + S_p) + margin(d,
// pos_margin)) and its share e^{log S_a - lse} of the anchor's negatives (0 without).
fn lifted_pair(d: f32) -> vec2<f32> {
    let own = state_f32(anchor_row);
    let lse = lifted_lse(own, state_f32(column));
    let g = max(lse + margin_of(d, params.p0), 0.0);
    return vec2<f32>(g, select(exp(own - lse), 0.0, own == LOWEST));
}

// Histogram: whether the pair (anchor, column) of role r is one of PML's (each unordered pair
// once; a negative pair where a side has a positive: the state's flags after 2 edges floats).
fn histogram_kept(r: u32) -> bool {
    if (column <= anchor_row) {
        return false;
    }
    if (r == ROLE_POSITIVE) {
        return true;
    }
    let flags = 2u * params.edges;
    return state_u32(flags + anchor_row) != 0u || state_u32(flags + column) != 0u;
}

// Histogram's lower node of similarity s (clamped to [-1, 1]; 1 in the top bin) and the
// weight of the node above it.
fn histogram_node(s: f32) -> vec2<f32> {
    let c = clamp(s, -1.0, 1.0);
    let delta = params.p0;
    let r = clamp(floor((c + 1.0) / delta), 0.0, f32(params.edges) - 2.0);
    return vec2<f32>(r, (c + 1.0 - r * delta) / delta);
}

var<workgroup> reduced: array<vec4<f32>, WORKGROUP_SIZE>;
var<workgroup> counted: array<vec4<u32>, WORKGROUP_SIZE>;
// FastAP: the row's (positive, negative) histograms, then dL/d(histogram) per bin.
var<workgroup> bins: array<vec2<f32>, MAX_EDGES>;
// FastAP: per bin its AP share and its two derivatives, before the cumulative sums.
var<workgroup> shares: array<vec4<f32>, MAX_EDGES>;
// FastAP: the anchor's loss, from invocation 0.
var<workgroup> fast_loss: f32;

// The per-anchor quantities stage 4 reads: the maxima, sums, counts and factors.
struct Anchor {
    top: vec4<f32>,
    sums: vec4<f32>,
    counts: vec4<u32>,
    // The rule's factors of its weights.
    f: vec4<f32>,
}

// What stage 2 adds up.
struct Part {
    s: vec4<f32>,
    c: vec4<u32>,
}

fn similarity() -> bool {
    return is_similarity(params.metric);
}

// dmargin(D, .)/dD; dmargin(., D)/dD is its negation.
fn first() -> f32 {
    return select(1.0, -1.0, similarity());
}

// PML's distance.margin(x, y).
fn margin_of(x: f32, y: f32) -> f32 {
    return select(x - y, y - x, similarity());
}

// log(1 + e^t) without overflow.
fn softplus(t: f32) -> f32 {
    return max(t, 0.0) + log1p(exp(-abs(t)));
}

// The workgroup's maximum (op 0) or sum (op 1) of v, on every invocation.
fn combine(t: u32, v: vec4<f32>, op: u32) -> vec4<f32> {
    workgroupBarrier();
    reduced[t] = v;
    for (var half = WORKGROUP_SIZE / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (t < half) {
            if (op == 0u) {
                reduced[t] = max(reduced[t], reduced[t + half]);
            } else {
                reduced[t] = reduced[t] + reduced[t + half];
            }
        }
    }
    return workgroupUniformLoad(&reduced[0]);
}

// The workgroup's sum of c, on every invocation.
fn count_up(t: u32, c: vec4<u32>) -> vec4<u32> {
    workgroupBarrier();
    counted[t] = c;
    for (var half = WORKGROUP_SIZE / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (t < half) {
            counted[t] = counted[t] + counted[t + half];
        }
    }
    return workgroupUniformLoad(&counted[0]);
}

// Stage 1: the logit whose maxima a rule takes (0 for the rules that take none).
fn logit(r: u32, d: f32) -> f32 {
    let positive = r == ROLE_POSITIVE;
    switch params.rule {
        case PAIR_MULTI_SIMILARITY: {
            let base = params.p2;
            return select(params.p1 * margin_of(base, d), params.p0 * margin_of(d, base), positive);
        }
        case PAIR_SUPCON: {
            // PML's float32 `±D / tau`, shifted by the row's maximum in `part`.
            return (-first() * d) / params.p0;
        }
        case PAIR_CIRCLE: {
            let m = params.p0;
            let gamma = params.p1;
            if (positive) {
                return -gamma * max(1.0 + m - d, 0.0) * (d - (1.0 - m));
            }
            return gamma * max(d + m, 0.0) * (d - m);
        }
        case PAIR_NCA: {
            return -first() * params.p0 * d;
        }
        case PAIR_SOFTMAX: {
            return params.p0 * select(d, target_margin(d).x, positive);
        }
        case PAIR_GENERALIZED_LIFTED: {
            return select(margin_of(params.p1, d), margin_of(d, params.p0), positive);
        }
        case PAIR_LIFTED: {
            return select(margin_of(params.p1, d), 0.0, positive);
        }
        case PAIR_RANKED_LIST: {
            let k = ranked(positive, d);
            return select(LOWEST, k.z, k.x != 0.0);
        }
        default: {
            return 0.0;
        }
    }
}

// MultiSimilarity's group maxima: PML adds a logit of 0 to each log-sum-exp.
fn with_zero(top: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(max(top.x, 0.0), max(top.y, 0.0), top.z, top.w);
}

// v in the P sum (x) or the N sum (y).
fn sided(positive: bool, v: f32) -> vec4<f32> {
    return select(vec4<f32>(0.0, v, 0.0, 0.0), vec4<f32>(v, 0.0, 0.0, 0.0), positive);
}

// RankedList: (kept, gap, T gap) of a pair: the positives past alpha - margin, the
// negatives inside alpha (both above 0), gap signed so that a larger one costs more. Its
// weight e^{T gap} is taken less the side's largest T gap (stage 1), and the side's 1e-5 m
// scaled to match, so that no exponential overflows.
fn ranked(positive: bool, d: f32) -> vec3<f32> {
    let inside = select((d < params.p1), (d > params.p0), positive);
    if (d <= 0.0 || !inside) {
        return vec3<f32>(0.0);
    }
    let gap = select(params.p1 - d, d - params.p0, positive);
    let t = select(params.p3, params.p2, positive);
    return vec3<f32>(1.0, gap, t * gap);
}

// RankedList's 1e-5 m under a side's shift `top` (0 where the side keeps no pair).
fn ranked_eps(top: f32) -> f32 {
    return select(1e-5 * f32(params.refs) * exp(-top), 0.0, top == LOWEST);
}

// IntraPairVariance's hinge of a pair: relu(a d + b mu) of its group.
fn variance_hinge(positive: bool, d: f32) -> f32 {
    let slope = select(params.p2, params.p0, positive);
    return max(slope * d + select(params.p3, params.p1, positive), 0.0);
}

// Stage 2: one pair's sums and counts, from the maxima `top` (P, N, every column).
fn part(r: u32, d: f32, top: vec4<f32>) -> Part {
    var p = Part(vec4<f32>(0.0), vec4<u32>(0u));
    let positive = r == ROLE_POSITIVE;
    let x = logit(r, d);
    switch params.rule {
        case PAIR_CONTRASTIVE, PAIR_MARGIN: {
            // The hinge of the pair's side; Margin's margin is added to the difference.
            var l: f32;
            if (params.rule == PAIR_CONTRASTIVE) {
                l = select(margin_of(params.p1, d), margin_of(d, params.p0), positive);
            } else {
                l = select(margin_of(params.p1, d), margin_of(d, params.p1), positive) + params.p0;
            }
            if (l > 0.0) {
                if (positive) {
                    p.s.x = l;
                    p.c.x = 1u;
                } else {
                    p.s.y = l;
                    p.c.y = 1u;
                }
            }
        }
        case PAIR_THRESHOLD_CONSISTENT: {
            if (positive && d <= params.p0) {
                p.s.x = params.p0 - d;
                p.c.x = 1u;
            } else if (!positive && d >= params.p1) {
                p.s.y = d - params.p1;
                p.c.y = 1u;
            }
        }
        case PAIR_MULTI_SIMILARITY: {
            let t = with_zero(top);
            p.s = sided(positive, exp(x - select(t.y, t.x, positive)));
        }
        case PAIR_CIRCLE, PAIR_GENERALIZED_LIFTED: {
            p.s = sided(positive, exp(x - select(top.y, top.x, positive)));
        }
        case PAIR_SUPCON: {
            // x less the row's maximum, as PML; its maximum over P and N is the shifted one's.
            let shifted = x - top.z;
            let top2 = max(top.x, top.y) - top.z;
            p.s.x = exp(shifted - top2);
            p.s.y = select(0.0, shifted, positive);
        }
        case PAIR_LIFTED: {
            if (params.forward != 0u) {
                // The first pass: the row's negatives' sum, for its log S.
                p.s.y = select(exp(x - top.y), 0.0, positive);
            } else if (positive) {
                // relu(t)^2 / 2, and what the row's negatives share (each pair comes both ways).
                let g = lifted_pair(d);
                p.s.x = g.x * g.x / 2.0;
                p.s.y = 2.0 * g.x * g.y;
            }
        }
        case PAIR_RANKED_LIST: {
            let k = ranked(positive, d);
            let w = select(0.0, exp(k.z - select(top.y, top.x, positive)), k.x != 0.0);
            let v = vec2<f32>(w * k.y, w);
            p.s = select(vec4<f32>(0.0, 0.0, v), vec4<f32>(v, 0.0, 0.0), positive);
        }
        case PAIR_INTRA_PAIR_VARIANCE: {
            var v = d;
            if (params.edges > 0u) {
                let h = variance_hinge(positive, d);
                v = select(h, h * h, params.edges == 2u);
            }
            p.s = sided(positive, v);
        }
        case PAIR_HISTOGRAM: {
            if (histogram_kept(r)) {
                p.c = select(vec4<u32>(0u, 1u, 0u, 0u), vec4<u32>(1u, 0u, 0u, 0u), positive);
            }
        }
        case PAIR_NCA, PAIR_SOFTMAX: {
            // Every column's share under the row's top, the positives' under theirs (so that
            // they keep their digits however far below the negatives they are).
            p.s.x = exp(x - max(top.x, top.y));
            p.s.y = select(0.0, exp(x - top.x), positive);
        }
        default: {}
    }
    return p;
}

// FastAP's pulse of bin c (below `edges`) at distance d: (height, d height / dD), 0 outside.
fn pulse(d: f32, c: u32) -> vec2<f32> {
    let delta = params.p0;
    let low = floor(d / delta);
    let at = f32(c);
    if (at != low && at != low + 1.0) {
        return vec2<f32>(0.0);
    }
    let offset = d - at * delta;
    let height = 1.0 - abs(offset) / delta;
    if (height <= 0.0) {
        return vec2<f32>(0.0);
    }
    // torch's |x| has slope 0 at 0.
    return vec2<f32>(height, select(-sign(offset) / delta, 0.0, offset == 0.0));
}

// FastAP's stage 3: the row's histograms bin by bin, then (on invocation 0) AP, the loss and
// dL/d(histogram) per bin into `bins`; returns the loss. Only for an anchor with a positive.
fn fast_ap_bins(t: u32, a: u32, k: f32) -> f32 {
    let m = params.refs;
    let row = a * m;
    for (var c = 0u; c < params.edges; c++) {
        var h = vec2<f32>(0.0);
        for (var j = t; j < m; j += WORKGROUP_SIZE) {
            let r = role(a, j);
            if (r != ROLE_NONE) {
                let height = pulse(distances[row + j], c).x;
                h += select(vec2<f32>(0.0, height), vec2<f32>(height, 0.0), r == ROLE_POSITIVE);
            }
        }
        let total = combine(t, vec4<f32>(h, 0.0, 0.0), 1u);
        if (t == 0u) {
            bins[c] = total.xy;
        }
    }
    workgroupBarrier();
    if (t == 0u) {
        // AP = sum_b p_b P_b / H_b (P, H cumulative), and its derivatives by p_c and n_c,
        // the cumulative sums taken back from the top.
        var cum_p = 0.0;
        var cum_h = 0.0;
        var ap = 0.0;
        for (var c = 0u; c < params.edges; c++) {
            let h = bins[c];
            cum_p += h.x;
            cum_h += h.x + h.y;
            var share = vec4<f32>(0.0);
            if (h.x * cum_p > 0.0 && cum_h > 0.0) {
                ap += h.x * cum_p / cum_h;
                let both = h.x * cum_p / (cum_h * cum_h);
                share = vec4<f32>(cum_p / cum_h, h.x / cum_h - both, -both, 0.0);
            }
            shares[c] = share;
        }
        var tail = vec2<f32>(0.0);
        for (var i = 0u; i < params.edges; i++) {
            let c = params.edges - 1u - i;
            let share = shares[c];
            tail += share.yz;
            bins[c] = vec2<f32>(-(share.x + tail.x) / k, -tail.y / k);
        }
        fast_loss = 1.0 - ap / k;
    }
    return workgroupUniformLoad(&fast_loss);
}

// Histogram's first pass: the row's kept pairs soft-binned into its (positive, negative)
// histograms, node by node, written after the anchor's words.
fn histogram_bins(t: u32, a: u32) {
    let m = params.refs;
    let row = a * m;
    let at = params.stride * (params.row0 + a) + 8u;
    for (var c = 0u; c < params.edges; c++) {
        var h = vec2<f32>(0.0);
        for (var j = t; j < m; j += WORKGROUP_SIZE) {
            column = j;
            let r = role(a, j);
            if (r != ROLE_NONE && histogram_kept(r)) {
                let node = histogram_node(distances[row + j]);
                let lower = u32(node.x);
                var v = 0.0;
                if (c == lower) {
                    v = 1.0 - node.y;
                } else if (c == lower + 1u) {
                    v = node.y;
                }
                h += select(vec2<f32>(0.0, v), vec2<f32>(v, 0.0), r == ROLE_POSITIVE);
            }
        }
        let total = combine(t, vec4<f32>(h, 0.0, 0.0), 1u);
        if (t == 0u) {
            totals[at + 2u * c] = bitcast<u32>(total.x);
            totals[at + 2u * c + 1u] = bitcast<u32>(total.y);
        }
    }
}

// Stage 3: the anchor's words in `totals`: three f32 and four counts.
struct Words {
    loss: vec3<f32>,
    counts: vec4<u32>,
}

fn anchor_words(n: Anchor, fast: f32) -> Words {
    let np = n.counts.x;
    let nn = n.counts.y;
    let s = n.sums;
    let c = n.counts;
    var w = Words(vec3<f32>(0.0), vec4<u32>(0u));
    switch params.rule {
        case PAIR_CONTRASTIVE, PAIR_THRESHOLD_CONSISTENT: {
            // Both groups' sums and nonzero counts: the host divides them.
            w = Words(vec3<f32>(s.x, s.y, 0.0), vec4<u32>(c.z, c.w, 0u, 0u));
        }
        case PAIR_MARGIN: {
            // The host counts every term once per pair of the other side.
            w = Words(vec3<f32>(s.x, s.y, 0.0), vec4<u32>(c.z, c.w, np, nn));
        }
        case PAIR_MULTI_SIMILARITY, PAIR_GENERALIZED_LIFTED: {
            w = Words(vec3<f32>(n.f.w, 0.0, 0.0), vec4<u32>(1u, nn, 0u, 0u));
        }
        case PAIR_FAST_AP: {
            if (np > 0u) {
                w = Words(vec3<f32>(fast, 0.0, 0.0), vec4<u32>(1u, nn, 0u, 0u));
            }
        }
        case PAIR_LIFTED: {
            if (params.forward == 0u) {
                w = Words(vec3<f32>(s.x, 0.0, 0.0), vec4<u32>(np, nn, 0u, 0u));
            } else if (nn > 0u) {
                // The row's log S, for the second pass.
                w = Words(vec3<f32>(n.top.y + log(s.y), 0.0, 0.0), vec4<u32>(1u, 0u, 0u, 0u));
            } else {
                w = Words(vec3<f32>(LOWEST, 0.0, 0.0), vec4<u32>(0u));
            }
        }
        case PAIR_RANKED_LIST: {
            w = Words(vec3<f32>(n.f.w, 0.0, 0.0), vec4<u32>(1u, nn, 0u, 0u));
        }
        case PAIR_INTRA_PAIR_VARIANCE: {
            // Each group's sum (of distances, hinges or squares) and its pairs.
            w = Words(vec3<f32>(s.x, s.y, 0.0), vec4<u32>(np, nn, 0u, 0u));
        }
        case PAIR_HISTOGRAM: {
            // The pairs the histograms hold; the histograms follow the words (first pass).
            w = Words(vec3<f32>(0.0), vec4<u32>(c.z, c.w, 0u, 0u));
        }
        default: {
            // SupCon, Circle, NCA: the loss where the anchor is kept (f.w > 0 then).
            if (n.f.z != 0.0) {
                w = Words(vec3<f32>(n.f.w, 0.0, 0.0), vec4<u32>(1u, nn, 0u, 0u));
            }
        }
    }
    return w;
}

// Stage 3's factors: f.x and f.y scale the P and N weights, f.z != 0 where the anchor is
// kept (SupCon, Circle, NCA), f.w the anchor's loss (for the words).
fn factors(top: vec4<f32>, s: vec4<f32>, np: u32, nn: u32) -> vec4<f32> {
    switch params.rule {
        case PAIR_MULTI_SIMILARITY: {
            let t = with_zero(top);
            // (1/alpha) log(e^{-t} + sum) per group over a nonempty group.
            let sum_p = exp(-t.x) + s.x;
            let sum_n = exp(-t.y) + s.y;
            var loss = 0.0;
            if (np > 0u) {
                loss += (t.x + log(sum_p)) / params.p0;
            }
            if (nn > 0u) {
                loss += (t.y + log(sum_n)) / params.p1;
            }
            return vec4<f32>(first() / sum_p, -first() / sum_n, 1.0, loss);
        }
        case PAIR_GENERALIZED_LIFTED: {
            let lse_p = select(0.0, top.x + log(s.x), np > 0u);
            let lse_n = select(0.0, top.y + log(s.y), nn > 0u);
            let loss = max(lse_p + lse_n, 0.0);
            if (loss > 0.0) {
                return vec4<f32>(first() / s.x, -first() / s.y, 1.0, loss);
            }
            return vec4<f32>(0.0, 0.0, 1.0, 0.0);
        }
        case PAIR_SUPCON: {
            if (np == 0u) {
                return vec4<f32>(0.0);
            }
            let top2 = max(top.x, top.y) - top.z;
            let loss = log(s.x) + top2 - s.y / f32(np);
            if (loss > 0.0) {
                let dz = -first() / params.p0;
                return vec4<f32>(dz / s.x, dz / f32(np), 1.0, loss);
            }
            return vec4<f32>(0.0);
        }
        case PAIR_CIRCLE: {
            if (np == 0u || nn == 0u) {
                return vec4<f32>(0.0);
            }
            let t = top.x + log(s.x) + top.y + log(s.y);
            let loss = softplus(t);
            // Kept where softplus(t) ~ e^t is not 0 in f32, as natively (decided on t: a
            // device that flushes subnormals would drop anchors the host keeps).
            if (t > LOG_ZERO) {
                let g = sigmoid(t);
                return vec4<f32>(g / s.x, g / s.y, 1.0, loss);
            }
            return vec4<f32>(0.0);
        }
        case PAIR_RANKED_LIST: {
            // Each side's sum (w gap) / (sum w + 1e-5 m), mixed by imbalance.
            // A side that keeps no pair adds 0 (its shifted sum of weights is at least 1 else).
            let part_p = select(0.0, s.x / (s.y + ranked_eps(top.x)), s.y > 0.0);
            let part_n = select(0.0, s.z / (s.w + ranked_eps(top.y)), s.w > 0.0);
            let loss = (1.0 - params.p4) * part_p + params.p4 * part_n;
            return vec4<f32>(part_p, part_n, 1.0, loss);
        }
        case PAIR_NCA, PAIR_SOFTMAX: {
            if (np == 0u) {
                return vec4<f32>(0.0);
            }
            // log of the positives' share of the softmax; PML's NCA drops the anchor where it
            // is 0 in f32 (a cross entropy keeps it).
            let log_share = top.x + log(s.y) - (max(top.x, top.y) + log(s.x));
            if (log_share > LOG_ZERO || params.rule == PAIR_SOFTMAX) {
                let dz = -first() * params.p0;
                return vec4<f32>(dz / s.x, dz / s.y, 1.0, -log_share);
            }
            return vec4<f32>(0.0);
        }
        default: {
            return vec4<f32>(0.0);
        }
    }
}

// Stage 4: dL/dD of pair (a, j) of role r at distance d.
fn weight(r: u32, d: f32, n: Anchor) -> f32 {
    let positive = r == ROLE_POSITIVE;
    let top = n.top;
    let f = n.f;
    let x = logit(r, d);
    switch params.rule {
        case PAIR_CONTRASTIVE: {
            let l = select(margin_of(params.p1, d), margin_of(d, params.p0), positive);
            if (l <= 0.0) {
                return 0.0;
            }
            return select(-first() * params.p3, first() * params.p2, positive);
        }
        case PAIR_MARGIN: {
            let l = select(margin_of(params.p1, d), margin_of(d, params.p1), positive) + params.p0;
            if (l <= 0.0) {
                return 0.0;
            }
            return select(-f32(n.counts.x) * first(), f32(n.counts.y) * first(), positive);
        }
        case PAIR_THRESHOLD_CONSISTENT: {
            if (positive && d <= params.p0) {
                return -params.p2;
            }
            if (!positive && d >= params.p1) {
                return params.p3;
            }
            return 0.0;
        }
        case PAIR_MULTI_SIMILARITY: {
            let t = with_zero(top);
            return select(exp(x - t.y) * f.y, exp(x - t.x) * f.x, positive);
        }
        case PAIR_GENERALIZED_LIFTED: {
            return select(exp(x - top.y) * f.y, exp(x - top.x) * f.x, positive);
        }
        case PAIR_CIRCLE: {
            let m = params.p0;
            let gamma = params.p1;
            if (positive) {
                return exp(x - top.x) * f.x * (-gamma * max(1.0 + m - d, 0.0));
            }
            return exp(x - top.y) * f.y * (gamma * max(d + m, 0.0));
        }
        case PAIR_SUPCON: {
            let top2 = max(top.x, top.y) - top.z;
            let e = exp(x - top.z - top2) * f.x;
            return select(e, e - f.y, positive);
        }
        case PAIR_NCA: {
            let all = exp(x - max(top.x, top.y)) * f.x;
            return select(all, all - exp(x - top.x) * f.y, positive);
        }
        case PAIR_SOFTMAX: {
            // The cross entropy's p - y, times the logit's slope (dz/dc: p0, and psi' on the
            // target).
            let all = exp(x - max(top.x, top.y)) * f.x;
            if (positive) {
                return (all - exp(x - top.x) * f.y) * target_margin(d).y;
            }
            return all;
        }
        case PAIR_LIFTED: {
            if (positive) {
                return first() * lifted_pair(d).x;
            }
            let own = n.sums.y;
            if (own > 0.0) {
                return -first() * own * exp(margin_of(params.p1, d) - state_f32(anchor_row));
            }
            return 0.0;
        }
        case PAIR_RANKED_LIST: {
            // d(num/den)/dgap = w (T gap + 1 - T part) / den; dgap/dD = +1 (P), -1 (N).
            let k = ranked(positive, d);
            if (k.x == 0.0) {
                return 0.0;
            }
            let t = select(params.p3, params.p2, positive);
            let side = select(top.y, top.x, positive);
            let part = select(f.y, f.x, positive);
            let den = select(n.sums.w, n.sums.y, positive) + ranked_eps(side);
            let share = select(params.p4, 1.0 - params.p4, positive);
            let slope = exp(k.z - side) * (t * k.y + 1.0 - t * part) / den;
            return select(-share * slope, share * slope, positive);
        }
        case PAIR_INTRA_PAIR_VARIANCE: {
            // d/dD of mean(relu(a D + b mu)^2) = (2 / K) (a r + b R / K): mu's own slope 1/K.
            let h = variance_hinge(positive, d);
            if (positive) {
                return params.p4 * (params.p0 * h + params.p6);
            }
            return params.p5 * (params.p2 * h + params.p7);
        }
        case PAIR_HISTOGRAM: {
            // The slope between the pair's two nodes (the state's derivatives by node, divided
            // by the bins' width and the pairs of the histogram); none outside [-1, 1].
            if (!histogram_kept(r) || d < -1.0 || d > 1.0) {
                return 0.0;
            }
            let node = u32(histogram_node(d).x) + select(params.edges, 0u, positive);
            return state_f32(node + 1u) - state_f32(node);
        }
        case PAIR_FAST_AP: {
            if (n.counts.x == 0u) {
                return 0.0;
            }
            let low = floor(d / params.p0);
            var w = 0.0;
            for (var i = 0u; i < 2u; i++) {
                let at = low + f32(i);
                if (at >= 0.0 && at < f32(params.edges)) {
                    let c = u32(at);
                    let slope = pulse(d, c).y;
                    w += slope * select(bins[c].y, bins[c].x, positive);
                }
            }
            return w;
        }
        default: {
            return 0.0;
        }
    }
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
    anchor_row = params.row0 + a;

    // 1. The counts and the maxima.
    var highest = vec4<f32>(LOWEST);
    var seen = vec4<u32>(0u);
    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        let r = role(a, j);
        let x = logit(r, distances[row + j]);
        if (r == ROLE_POSITIVE) {
            seen.x += 1u;
            highest.x = max(highest.x, x);
        } else if (r == ROLE_NEGATIVE) {
            seen.y += 1u;
            highest.y = max(highest.y, x);
        }
        highest.z = max(highest.z, x);
    }
    // Uniform from here: every invocation holds the workgroup's values.
    let top = combine(t, highest, 0u);
    let roles = count_up(t, seen);

    // 2. The sums.
    var sum = vec4<f32>(0.0);
    var hinges = vec4<u32>(0u);
    for (var j = t; j < m; j += WORKGROUP_SIZE) {
        let r = role(a, j);
        if (r != ROLE_NONE) {
            column = j;
            let p = part(r, distances[row + j], top);
            sum += p.s;
            hinges += p.c;
        }
    }
    let sums = combine(t, sum, 1u);
    let nonzero = count_up(t, hinges);

    // 3. The anchor.
    var fast = 0.0;
    if (params.rule == PAIR_FAST_AP && roles.x > 0u) {
        fast = fast_ap_bins(t, a, f32(roles.x));
    }
    if (params.rule == PAIR_HISTOGRAM && params.forward != 0u) {
        histogram_bins(t, a);
    }
    let counts = vec4<u32>(roles.x, roles.y, nonzero.x, nonzero.y);
    let n = Anchor(top, sums, counts, factors(top, sums, roles.x, roles.y));

    // 4. The weights.
    if (params.forward == 0u) {
        for (var j = t; j < m; j += WORKGROUP_SIZE) {
            let d = distances[row + j];
            let r = role(a, j);
            var w = 0.0;
            if (r != ROLE_NONE) {
                column = j;
                w = weight(r, d, n);
            }
            u[row + j] = pair_weight(a, j, w, d);
        }
    }

    if (t == 0u) {
        let words = anchor_words(n, fast);
        let at = params.stride * (params.row0 + a);
        totals[at] = bitcast<u32>(words.loss.x);
        totals[at + 1u] = bitcast<u32>(words.loss.y);
        totals[at + 2u] = bitcast<u32>(words.loss.z);
        totals[at + 3u] = words.counts.x;
        totals[at + 4u] = words.counts.y;
        totals[at + 5u] = words.counts.z;
        totals[at + 6u] = words.counts.w;
        totals[at + 7u] = 0u;
    }
}
