// PML's pair losses (src/ops/loss/pair_rules.rs has each rule's formula) over one block of
// anchors, as weights for their gradient: for every anchor row of the block's distance matrix,
// the rule's sums and U, the weight of each (anchor, reference) pair that loss_backward.wgsl
// multiplies with the embeddings. One skeleton, every rule a few pieces of it:
//
//   1. over the row: |P| and |N| (P: label[j] == label[a], j not the anchor's own slot; N:
//      label[j] != label[a]) and the maxima of the rule's logit over P, over N, and over
//      every column (SupCon's row maximum);                                   `logit`
//   2. over the row: four sums and four counts, from the maxima;             `part`
//   3. once per anchor: the loss's words and the factors of its weights;    `anchor_of`
//      (FastAP first bins the row into its histograms: `fast_ap_bins`)
//   4. over the row: W = dL/dD for each pair, then U as loss_backward takes it. `weight`
//
// The rules (codes PAIR_*, set from Rust), with `margin(x, y)` = x - y for distances and
// y - x for similarities, and `first` = dmargin(D, .)/dD (+1 for distances, -1 for
// similarities):
//   CONTRASTIVE (p0 pos_margin, p1 neg_margin, p2 1/|nonzero P pairs|, p3 1/|nonzero N pairs|)
//   MULTI_SIMILARITY (p0 alpha, p1 beta, p2 base), SUPCON (p0 temperature),
//   CIRCLE (p0 m, p1 gamma), NCA (p0 softmax_scale), GENERALIZED_LIFTED (p0, p1 margins),
//   MARGIN (p0 margin, p1 beta), FAST_AP (p0 the bins' width, `edges` bins),
//   THRESHOLD_CONSISTENT (p0 m+, p1 m-, p2 lambda+ / |P kept|, p3 lambda- / |N kept|).
// Contrastive and TCM divide by counts over every anchor: a first pass with `forward` set
// counts them (U untouched), the second takes the weights already divided.
//
//   totals[8 (row0 + a) ..] = three f32 words (the loss, or the sums the host combines: see
//             src/ops/loss/pair_device.rs), four counts, a zero
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
    _pad0: u32,
    _pad1: u32,
    // The rule's parameters (above).
    p0: f32,
    p1: f32,
    p2: f32,
    p3: f32,
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
// FastAP's most bins (pair_weights::MAX_EDGES).
const MAX_EDGES: u32 = 256u;

// The maxima's start: below every logit (an empty group keeps it, and is never read).
const LOWEST: f32 = -3.40282347e38;
// log of f32's smallest subnormal, halved up: a probability below e^this is 0 in f32.
const LOG_ZERO: f32 = -103.28;

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
        case PAIR_GENERALIZED_LIFTED: {
            return select(margin_of(params.p1, d), margin_of(d, params.p0), positive);
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
        case PAIR_NCA: {
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
            if (loss > 0.0) {
                let g = sigmoid(t);
                return vec4<f32>(g / s.x, g / s.y, 1.0, loss);
            }
            return vec4<f32>(0.0);
        }
        case PAIR_NCA: {
            if (np == 0u) {
                return vec4<f32>(0.0);
            }
            // log of the positives' share of the softmax; PML drops the anchor where it is 0
            // in f32.
            let log_share = top.x + log(s.y) - (max(top.x, top.y) + log(s.x));
            if (log_share > LOG_ZERO) {
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
    let counts = vec4<u32>(roles.x, roles.y, nonzero.x, nonzero.y);
    let n = Anchor(top, sums, counts, factors(top, sums, roles.x, roles.y));

    // 4. The weights.
    if (params.forward == 0u) {
        for (var j = t; j < m; j += WORKGROUP_SIZE) {
            let d = distances[row + j];
            let r = role(a, j);
            var w = 0.0;
            if (r != ROLE_NONE) {
                w = weight(r, d, n);
            }
            u[row + j] = pair_weight(a, j, w, d);
        }
    }

    if (t == 0u) {
        let words = anchor_words(n, fast);
        let at = 8u * (params.row0 + a);
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
