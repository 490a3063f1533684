//! `triplet_lists` on the GPU against its CPU reference. Every valid triplet is `P_a × N_a`,
//! which the wgpu path expands on the host from the kernel's lists as read back: the mined
//! triplets are therefore exactly the reference lists expanded. Covers every self-exclusion,
//! one class, sizes off the workgroup's 64 segments, and a workgroup limit that cuts the
//! anchors into many chunks.

use crate::common;

use ndarray::Array1;
use proptest::prelude::*;
use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
use wgpu_metric_learning::{
    mine_triplets, Context, ContextConfig, MiningSet, SelfExclusion, TripletConfig,
};

/// The reference lists of `labels` against `refs` (dense ids), expanded to `(a, p, n)` rows.
fn expanded(labels: &[u32], refs: &[u32], slots: &[u32]) -> Vec<[u32; 3]> {
    let mut rows = Vec::new();
    for (a, (positives, negatives)) in triplet_lists(labels, refs, slots).iter().enumerate() {
        for &p in positives {
            for &n in negatives {
                rows.push([a as u32, p, n]);
            }
        }
    }
    rows
}

fn check(ctx: &Context, labels: &[u32], refs: &[u32], exclusion: SelfExclusion) {
    let slots: Vec<u32> = match &exclusion {
        SelfExclusion::SameIndex => (0..labels.len() as u32).collect(),
        SelfExclusion::QuerySlots(s) => s.clone(),
        _ => vec![u32::MAX; labels.len()],
    };
    let (q, r) = (Array1::from(labels.to_vec()), Array1::from(refs.to_vec()));
    let cfg = TripletConfig {
        self_exclusion: exclusion,
        ..Default::default()
    };
    let got = mine_triplets(
        ctx,
        &MiningSet::from_labels(&q),
        Some(&MiningSet::from_labels(&r)),
        &cfg,
    )
    .expect("all triplets");
    let got: Vec<[u32; 3]> = got
        .indices
        .rows()
        .into_iter()
        .map(|t| [t[0], t[1], t[2]])
        .collect();
    assert_eq!(
        got,
        expanded(labels, refs, &slots),
        "triplets = reference lists expanded"
    );
}

/// Labels of `b` anchors and `m` references in `classes` classes, and a self-exclusion.
fn problem() -> impl Strategy<Value = (Vec<u32>, Vec<u32>, SelfExclusion)> {
    (1usize..40, 1usize..200, 1u32..6, 0usize..3).prop_flat_map(|(b, m, classes, which)| {
        let b = if which == 1 { b.min(m) } else { b };
        (
            proptest::collection::vec(0..classes, b),
            proptest::collection::vec(0..classes, m),
            proptest::collection::vec(0..m as u32, b),
            Just(which),
        )
            .prop_map(|(labels, refs, slots, which)| {
                let exclusion = match which {
                    0 => SelfExclusion::None,
                    1 => SelfExclusion::SameIndex,
                    _ => SelfExclusion::QuerySlots(slots),
                };
                (labels, refs, exclusion)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(16)))]

    #[test]
    fn triplet_lists_gpu_matches_reference((labels, refs, exclusion) in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            check(ctx, &labels, &refs, exclusion);
        }
    }
}

#[test]
fn triplet_lists_edge_cases() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    // One class: no negatives, no triplets.
    check(ctx, &[0; 5], &[0; 9], SelfExclusion::None);
    // 129 references: two full 64-wide segments and one of a single reference.
    let refs: Vec<u32> = (0..129).map(|i| i % 3).collect();
    check(
        ctx,
        &[0, 1, 2],
        &refs,
        SelfExclusion::QuerySlots(vec![0, 128, 5]),
    );
}

#[test]
fn triplet_lists_under_a_tiny_workgroup_limit() {
    // One workgroup per anchor, at most 3 per dimension: 20 anchors in chunks of 3.
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 3,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    let ctx = common::gpu_context_with(ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits");
    let labels: Vec<u32> = (0..20).map(|i| i % 4).collect();
    check(&ctx, &labels, &labels, SelfExclusion::SameIndex);
}
