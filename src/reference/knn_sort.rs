//! Reference of `shaders/knn_sort.wgsl`: best lists sorted, keys mapped back to scores.

use ndarray::{Array2, ArrayView2};

use crate::kernels::knn_select::{score_of, EMPTY_INDEX};

/// Per row of `(keys, indices)` `(q, k)` (slots in any order; a key's unsigned order is
/// "better first"): the slots sorted by `(key, index)`, returned as `(indices, scores)`,
/// each `(q, k)`; a score is its key mapped back (with `largest`, keys were made from negated
/// similarities), and an empty slot (index `u32::MAX - 1`) has score NaN.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::reference::knn_sort::knn_sort;
/// // Keys of the distances 0.5 and 0.25 (their bits with the sign bit set), tied on 0.5.
/// let k = |d: f32| d.to_bits() | 0x8000_0000;
/// let keys = array![[k(0.5), k(0.25), k(0.5)]];
/// let (idx, val) = knn_sort(keys.view(), array![[7u32, 9, 3]].view(), false);
/// assert_eq!(idx, array![[9u32, 3, 7]]);
/// assert_eq!(val, array![[0.25f32, 0.5, 0.5]]);
/// ```
pub fn knn_sort(
    keys: ArrayView2<'_, u32>,
    indices: ArrayView2<'_, u32>,
    largest: bool,
) -> (Array2<u32>, Array2<f32>) {
    let (q, k) = keys.dim();
    let mut out_indices = Array2::zeros((q, k));
    let mut out_scores = Array2::zeros((q, k));
    for r in 0..q {
        let mut row: Vec<(u32, u32)> = keys
            .row(r)
            .iter()
            .zip(indices.row(r))
            .map(|(&key, &index)| (key, index))
            .collect();
        row.sort();
        for (s, (key, index)) in row.into_iter().enumerate() {
            out_indices[[r, s]] = index;
            out_scores[[r, s]] = if index >= EMPTY_INDEX {
                f32::NAN
            } else {
                score_of(key, largest)
            };
        }
    }
    (out_indices, out_scores)
}

#[cfg(test)]
mod tests {
    //! The kernel alone against `reference::knn_sort` on shuffled lists: every `k` from 1 to
    //! past two workgroups' width, ties on keys, empty slots, similarities and distances.

    use super::*;
    use crate::context::{test_gpu_context, Context};
    use crate::kernels::knn_select::key_of;
    use crate::kernels::knn_sort::{KnnSort, Params, SortBuffers};
    use crate::runtime::transfer::{self, f32s, test_input, test_read, Recorder};
    use proptest::prelude::*;

    /// Runs the kernel over `(keys, indices)` `(rows, k)` and reads both outputs back.
    fn run(
        ctx: &Context,
        keys: &Array2<u32>,
        indices: &Array2<u32>,
        largest: bool,
    ) -> (Array2<u32>, Array2<f32>) {
        let gpu = ctx.gpu().expect("a wgpu context");
        let (rows, k) = keys.dim();
        let slots: Vec<u32> = keys
            .iter()
            .zip(indices.iter())
            .flat_map(|(&key, &index)| [key, index])
            .collect();
        let lists = test_input(gpu, &slots);
        let params = Params {
            rows: rows as u32,
            k: k as u32,
            largest: u32::from(largest),
            _pad: 0,
        };
        let params = transfer::uniform(gpu, "test::params", &params).expect("params");
        let out_indices = transfer::output(gpu, "test::indices", f32s(rows * k)).expect("out");
        let out_scores = transfer::output(gpu, "test::scores", f32s(rows * k)).expect("out");
        let mut rec = Recorder::new(gpu, "test::knn_sort");
        rec.sentinel(&out_indices, f32s(rows * k))
            .expect("sentinel");
        rec.sentinel(&out_scores, f32s(rows * k)).expect("sentinel");
        let b = SortBuffers {
            params: &params,
            lists: &lists,
            indices: &out_indices,
            scores: &out_scores,
        };
        let kernel = gpu.kernel::<KnnSort>().expect("kernel");
        kernel.encode(&mut rec, rows as u64, &b).expect("encode");
        let read = test_read(
            gpu,
            rec,
            &[(&out_indices, rows * k), (&out_scores, rows * k)],
        );
        let shaped = |v: Vec<u32>| Array2::from_shape_vec((rows, k), v).expect("shape");
        (
            shaped(read[0].clone()),
            shaped(read[1].clone()).mapv(f32::from_bits),
        )
    }

    fn same(a: &Array2<f32>, b: &Array2<f32>) -> bool {
        a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// Lists of `k` distinct indices, scores from few values (ties), some slots empty.
    fn lists(rows: usize, k: usize, seed: u64, largest: bool) -> (Array2<u32>, Array2<u32>) {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut keys = Array2::zeros((rows, k));
        let mut indices = Array2::zeros((rows, k));
        for r in 0..rows {
            let empty = usize::from(next() % 4 == 0) * (next() as usize % (k + 1));
            let mut order: Vec<u32> = (0..k as u32).map(|i| 3 * i + (next() % 3) as u32).collect();
            for i in (1..k).rev() {
                order.swap(i, next() as usize % (i + 1));
            }
            for (s, &index) in order.iter().enumerate() {
                if s < empty {
                    keys[[r, s]] = u32::MAX;
                    indices[[r, s]] = EMPTY_INDEX;
                } else {
                    let score = (next() % 5) as f32 * 0.5 - 1.0;
                    keys[[r, s]] = key_of(score, largest);
                    indices[[r, s]] = index;
                }
            }
        }
        (keys, indices)
    }

    fn check(ctx: &Context, (rows, k): (usize, usize), seed: u64, largest: bool) {
        let (keys, indices) = lists(rows, k, seed, largest);
        let (idx, val) = run(ctx, &keys, &indices, largest);
        let (ri, rv) = knn_sort(keys.view(), indices.view(), largest);
        assert_eq!(idx, ri, "indices, k = {k}, largest = {largest}");
        assert!(
            same(&val, &rv),
            "scores, k = {k}, largest = {largest}: {val} vs {rv}"
        );
    }

    #[test]
    fn sorts_like_the_reference_at_workgroup_edges() {
        let Some(ctx) = test_gpu_context() else {
            return;
        };
        for k in [1, 2, 3, 5, 255, 256, 257, 511, 513, 1000] {
            for largest in [false, true] {
                check(&ctx, (3, k), k as u64 + 7, largest);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn sorts_like_the_reference(rows in 1usize..40, k in 1usize..300, seed: u64, largest: bool) {
            let Some(ctx) = test_gpu_context() else { return Ok(()) };
            check(&ctx, (rows, k), seed, largest);
        }
    }
}
