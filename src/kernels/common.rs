//! The shared WGSL of `shaders/common/`, composed in front of each kernel's own source by
//! [`wgsl!`] (plain `concat!` of `include_str!`s: no build script), and the codes both sides
//! use. A kernel's registered source ([`WgslKernel::source`](super::WgslKernel)) is the
//! composed text, so naga's validation, the reflection against the wrapper's spec and the
//! four-language translation all check it whole. `tests/shaders.rs` fails if a function of a
//! common file is defined again in a kernel, or if two kernels carry the same function.
//!
//! The parts, in the order a kernel composes them: `math` (log1p, sigmoid), `metric` (metric
//! codes, `inv_norm`, `scale_of`, the distance epilogue `metric_of`), `tile` (the distance
//! tile's uniform block, bindings and loads; after `metric`), `margin` (TripletMarginMiner's
//! rule), `pairs` (`anchor_of`), `roles` (a reference's role for an anchor), `pair_weight` (a
//! loss's per-pair weight; after `metric`). The last four name globals of the kernel they are
//! composed into: each file's header says which.

use crate::metric::Distance;

/// The composed source of kernel `stem` with the common parts named: `wgsl!("stem", "metric",
/// "tile")` is `shaders/common/metric.wgsl`, then `shaders/common/tile.wgsl`, then
/// `shaders/stem.wgsl`, as one `&'static str`.
macro_rules! wgsl {
    ($stem:literal $(, $common:literal)* $(,)?) => {
        concat!(
            $(include_str!(concat!("../../shaders/common/", $common, ".wgsl")),)*
            include_str!(concat!("../../shaders/", $stem, ".wgsl"))
        )
    };
}
pub(crate) use wgsl;

/// Every file of `shaders/common/` by name, with its text (for the tests that check the
/// composition).
#[cfg_attr(not(test), allow(dead_code, reason = "read by the reflection test"))]
pub(crate) const PARTS: &[(&str, &str)] = &[
    ("margin", include_str!("../../shaders/common/margin.wgsl")),
    ("math", include_str!("../../shaders/common/math.wgsl")),
    ("metric", include_str!("../../shaders/common/metric.wgsl")),
    (
        "pair_weight",
        include_str!("../../shaders/common/pair_weight.wgsl"),
    ),
    ("pairs", include_str!("../../shaders/common/pairs.wgsl")),
    ("roles", include_str!("../../shaders/common/roles.wgsl")),
    ("tile", include_str!("../../shaders/common/tile.wgsl")),
];

/// The miner rule codes of `params.mode` (common/margin.wgsl's `RULE_*`), which
/// `TripletRule::mode` gives.
pub(crate) mod rule {
    /// Every valid triplet (labels only).
    pub(crate) const ALL_VALID: u32 = 0;
    /// TripletMarginMiner "all": `tm <= margin`.
    pub(crate) const ALL: u32 = 1;
    /// "hard": `tm <= margin` and `tm <= 0`.
    pub(crate) const HARD: u32 = 2;
    /// "semihard": `tm <= margin` and `tm > 0`.
    pub(crate) const SEMIHARD: u32 = 3;
    /// "easy": `tm > margin`.
    pub(crate) const EASY: u32 = 4;
}

/// A reference's role for an anchor (common/roles.wgsl's `ROLE_*`): the anchor's own row, its
/// label, another label. The kernels use them among themselves; Rust fixes their values here.
pub(crate) mod role {
    pub(crate) const NONE: u32 = 0;
    pub(crate) const POSITIVE: u32 = 1;
    pub(crate) const NEGATIVE: u32 = 2;
}

/// Every `const` of `shaders/common/` with the Rust value it must equal (checked by
/// reflection in every composed kernel that declares it).
#[cfg_attr(not(test), allow(dead_code, reason = "read by the reflection test"))]
pub(crate) fn codes() -> Vec<(&'static str, u32)> {
    vec![
        ("METRIC_EUCLIDEAN", Distance::Euclidean.code()),
        (
            "METRIC_SQUARED_EUCLIDEAN",
            Distance::SquaredEuclidean.code(),
        ),
        ("METRIC_COSINE", Distance::Cosine.code()),
        ("METRIC_DOT", Distance::DotProduct.code()),
        ("RULE_ALL_VALID", rule::ALL_VALID),
        ("RULE_ALL", rule::ALL),
        ("RULE_HARD", rule::HARD),
        ("RULE_SEMIHARD", rule::SEMIHARD),
        ("RULE_EASY", rule::EASY),
        ("ROLE_NONE", role::NONE),
        ("ROLE_POSITIVE", role::POSITIVE),
        ("ROLE_NEGATIVE", role::NEGATIVE),
    ]
}
