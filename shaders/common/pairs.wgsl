// common/pairs.wgsl: the (anchor, positive) pairs of a dispatch, numbered across its anchors.
// Expects of the kernel it is composed into: `params.anchors` and the binding `pair_base`
// (anchor i's first pair number, ascending).

// The anchor owning pair number `pair`: the last i with pair_base[i] <= pair.
fn anchor_of(pair: u32) -> u32 {
    var lo = 0u;
    var hi = params.anchors;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (pair_base[mid] <= pair) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}
