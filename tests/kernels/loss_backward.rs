//! `loss_backward` on the GPU against its reference (with `triplet_weights`', see
//! `tests/triplet_weights.rs`): blocks of up to 150 anchors and references cross its 64-row
//! tiles (16 invocations × 4 rows) and its 16-step stages, and up to 140 dimensions (35
//! `vec4`s) its 32-`vec4` tiles of the dimension.

use crate::common;
use crate::kernels::triplet_weights::{check, problem};

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(48)))]

    #[test]
    fn loss_backward_matches_the_reference_across_tiles(p in problem(150, 150, 140)) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &p);
        }
    }
}
