//! Reference of `shaders/triplet_expand.wgsl`: triplet rows from segments.

/// Segment `s` owns rows `starts[s] .. starts[s + 1]` (`starts` ascending from 0, one longer
/// than `heads`), each `(heads[s].0, heads[s].1, negative)` with the negatives taken in order
/// from `source`, element `sources[s]` on. Returns the rows `(starts[last], 3)`, flat.
///
/// # Example
/// ```
/// use wgpu_metric_learning::reference::triplet_expand::triplet_expand;
/// let negatives = [7u32, 8, 9];
/// // Anchor 0 with positive 1 against all three negatives, then with positive 2 against the last two.
/// let rows = triplet_expand(&[0, 3, 5], &[[0, 1], [0, 2]], &[0, 1], &negatives);
/// assert_eq!(rows, vec![0, 1, 7, 0, 1, 8, 0, 1, 9, 0, 2, 8, 0, 2, 9]);
/// ```
pub fn triplet_expand(
    starts: &[u32],
    heads: &[[u32; 2]],
    sources: &[u32],
    source: &[u32],
) -> Vec<u32> {
    let mut rows = Vec::new();
    for (s, &[anchor, positive]) in heads.iter().enumerate() {
        let count = starts[s + 1] - starts[s];
        for i in 0..count {
            rows.extend([anchor, positive, source[(sources[s] + i) as usize]]);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    //! The kernel alone against `reference::triplet_expand`: random segments (long, short,
    //! one row), sources anywhere in the negatives, row counts off the workgroup.

    use super::*;
    use crate::context::{test_gpu_context, Context};
    use crate::kernels::triplet_expand::{ExpandBuffers, Params, TripletExpand};
    use crate::runtime::transfer::{self, f32s, test_input, test_read, Recorder};
    use proptest::prelude::*;

    fn run(
        ctx: &Context,
        starts: &[u32],
        heads: &[[u32; 2]],
        sources: &[u32],
        source: &[u32],
    ) -> Vec<u32> {
        let gpu = ctx.gpu().expect("a wgpu context");
        let rows = *starts.last().expect("starts") as usize;
        let flat_heads: Vec<u32> = heads.iter().flatten().copied().collect();
        let params = Params {
            segments: heads.len() as u32,
            rows: rows as u32,
            _pad: [0; 2],
        };
        let params = transfer::uniform(gpu, "test::params", &params).expect("params");
        let out = transfer::output(gpu, "test::out", f32s(3 * rows)).expect("out");
        let mut rec = Recorder::new(gpu, "test::triplet_expand");
        rec.sentinel(&out, f32s(3 * rows)).expect("sentinel");
        let (starts, heads, sources, source) = (
            test_input(gpu, starts),
            test_input(gpu, &flat_heads),
            test_input(gpu, sources),
            test_input(gpu, source),
        );
        let b = ExpandBuffers {
            params: &params,
            starts: &starts,
            heads: &heads,
            sources: &sources,
            source: &source,
            out: &out,
        };
        let kernel = gpu.kernel::<TripletExpand>().expect("kernel");
        kernel.encode(&mut rec, rows as u64, &b).expect("encode");
        test_read(gpu, rec, &[(&out, 3 * rows)]).remove(0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn expands_like_the_reference(
            counts in prop::collection::vec(1u32..700, 1..40),
            seed: u64,
        ) {
            let Some(ctx) = test_gpu_context() else { return Ok(()) };
            let mut starts = vec![0u32];
            for c in &counts {
                starts.push(starts.last().copied().unwrap_or(0) + c);
            }
            let width = 700u32;
            let source: Vec<u32> = (0..2 * width).map(|i| i ^ (seed as u32)).collect();
            let heads: Vec<[u32; 2]> = (0..counts.len() as u32)
                .map(|s| [s / 3, s.wrapping_mul(seed as u32 | 1)])
                .collect();
            let sources: Vec<u32> = counts
                .iter()
                .enumerate()
                .map(|(s, &c)| (seed as u32).wrapping_add(s as u32 * 97) % (2 * width - c + 1))
                .collect();
            let got = run(&ctx, &starts, &heads, &sources, &source);
            prop_assert_eq!(got, triplet_expand(&starts, &heads, &sources, &source));
        }
    }
}
