// common/pair_weight.wgsl: a loss's weight of pair (a, j) as loss_backward.wgsl takes it.
// Composed after metric.wgsl. Expects of the kernel it is composed into: `params.dim4`,
// `params.metric`, `params.normalize`, `params.near` and the bindings `queries`, `refs`
// (vec4 rows), `query_sq_norms`, `ref_sq_norms`.

// |q^ - r^| summed from the rows (each scaled by its factor), where the distance from the
// dot product has lost its digits to cancellation.
fn exact_distance(a: u32, j: u32, sq: f32, sr: f32) -> f32 {
    var acc = 0.0;
    for (var k = 0u; k < params.dim4; k++) {
        let diff = queries[a * params.dim4 + k] * sq - refs[j * params.dim4 + k] * sr;
        acc += dot(diff, diff);
    }
    return sqrt(acc);
}

// U from W = dL/dD and the distance `d`: W / D (Euclidean; D recomputed from the rows below
// the threshold `near`, 0 where D is 0), 2 W (squared Euclidean), W (cosine, dot product).
fn pair_weight(a: u32, j: u32, w: f32, d: f32) -> f32 {
    switch params.metric {
        case METRIC_EUCLIDEAN: {
            if (w == 0.0) {
                return 0.0;
            }
            let q2 = query_sq_norms[a];
            let r2 = ref_sq_norms[j];
            let sq = scale_of(q2, params.normalize);
            let sr = scale_of(r2, params.normalize);
            if (d * d < params.near * ((q2 * sq) * sq + (r2 * sr) * sr)) {
                let exact = exact_distance(a, j, sq, sr);
                return select(0.0, w / exact, exact > 0.0);
            }
            return select(0.0, w / d, d > 0.0);
        }
        case METRIC_SQUARED_EUCLIDEAN: {
            return 2.0 * w;
        }
        default: {
            return w;
        }
    }
}
