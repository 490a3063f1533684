//! The emit passes of `triplet_select` and `negative_buckets` write each pair's triplets only
//! into the pair's own slice of the output, as the offsets (from the count pass) give it,
//! even when they find more kept negatives than were counted: a compiler may contract the
//! rule's arithmetic differently in two pipelines (fma, fast math), and a pair must then not
//! write into the next pair's slots. Checked on the device with counts made too small by hand.

use crate::context::test_gpu_context as gpu_context;
use crate::kernels::negative_buckets::{self, BucketBuffers, NegativeBuckets, PairPass};
use crate::kernels::triplet_select::{self, Pass, SelectBuffers, TripletSelect};
use crate::runtime::device::GpuDevice;
use crate::runtime::memory::TrackedBuffer;
use crate::runtime::transfer::{self, f32s, Recorder, Staging, SENTINEL_BITS};

/// Two anchors over 5 references each: reference 0 the positive (value 0.1), references
/// 1..=4 the negatives (values 0.2 .. 0.5, ascending, so `order` is the negatives' own
/// order), under "all" with margin 1: every negative is kept, 4 per pair. The offsets claim
/// only 3 for pair 0 and none for pair 1: `out` must hold pair 0's first 3 negatives and
/// then, in its fourth slot, still the sentinel.
struct Case {
    params_select: TrackedBuffer,
    params_buckets: TrackedBuffer,
    distances: TrackedBuffer,
    positives: TrackedBuffer,
    negatives: TrackedBuffer,
    list_counts: TrackedBuffer,
    pair_base: TrackedBuffer,
    offsets: TrackedBuffer,
    out: TrackedBuffer,
    scratch: TrackedBuffer,
    unused: TrackedBuffer,
}

const REFS: usize = 5;

impl Case {
    fn new(gpu: &GpuDevice) -> Self {
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let filled = |label, data: &[u32]| {
            let b =
                transfer::create_buffer(gpu, label, f32s(data.len()), input).expect("input buffer");
            transfer::write(gpu, &b, 0, data).expect("write");
            b
        };
        let row: [f32; REFS] = [0.1, 0.2, 0.3, 0.4, 0.5];
        let distances: Vec<u32> = row.iter().chain(&row).map(|v| v.to_bits()).collect();
        let params_select = transfer::uniform(
            gpu,
            "bounds::select_params",
            &triplet_select::Params {
                anchors: 2,
                refs: REFS as u32,
                mode: 1,
                inverted: 0,
                margin: 1.0,
                pair_lo: 0,
                pair_hi: 2,
                _pad0: 0,
                start: [0; 2],
                _pad: [0; 2],
            },
        )
        .expect("params");
        let params_buckets = transfer::uniform(
            gpu,
            "bounds::bucket_params",
            &negative_buckets::Params {
                anchors: 2,
                refs: REFS as u32,
                mode: 1,
                margin: 1.0,
                pair_lo: 0,
                pair_hi: 2,
                bitmap_words: negative_buckets::bitmap_words(REFS) as u32,
                ..Default::default()
            },
        )
        .expect("params");
        let out = transfer::output(gpu, "bounds::out", f32s(4)).expect("out");
        transfer::write(gpu, &out, 0, &[SENTINEL_BITS; 4]).expect("sentinel");
        Self {
            params_select,
            params_buckets,
            distances: filled("bounds::distances", &distances),
            positives: filled("bounds::positives", &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            // Per anchor row: the negatives, which are also `order` (ascending values).
            negatives: filled("bounds::negatives", &[1, 2, 3, 4, 0, 1, 2, 3, 4, 0]),
            list_counts: filled("bounds::list_counts", &[1, 4, 1, 4]),
            pair_base: filled("bounds::pair_base", &[0, 1, 2]),
            // Exclusive prefix sums as (low, high) words: pair 0 claims 3, pair 1 none.
            offsets: filled("bounds::offsets", &[0, 0, 3, 0, 3, 0]),
            out,
            scratch: transfer::output(gpu, "bounds::scratch", f32s(2)).expect("scratch"),
            unused: filled("bounds::unused", &[0]),
        }
    }

    /// Runs what `rec` recorded and checks `out`: pair 0's first 3 negatives, then still the
    /// sentinel in the fourth slot.
    fn assert_pair_0_stops_at_its_3_slots(&self, mut rec: Recorder<'_>) {
        let gpu = rec.gpu();
        let staging = Staging::new(gpu, "bounds::staging", f32s(4)).expect("staging");
        rec.read_back(&self.out, 0, &staging, 0, 16);
        let done = rec.submit().expect("submit");
        let out = staging
            .map(&done, 16)
            .read::<u32, _>(gpu, 4, <[u32]>::to_vec)
            .expect("read");
        assert_eq!(
            out,
            vec![1, 2, 3, SENTINEL_BITS],
            "pair 0 stops at its 3 slots"
        );
    }
}

#[test]
fn triplet_select_emit_stays_in_its_pairs_slice() {
    let Some(ctx) = gpu_context() else {
        return;
    };
    let gpu = ctx.gpu().expect("wgpu context");
    let case = Case::new(gpu);
    let kernel = gpu.kernel::<TripletSelect>().expect("kernel");
    let mut rec = Recorder::new(gpu, "bounds");
    let buffers = SelectBuffers {
        params: &case.params_select,
        distances: &case.distances,
        positives: &case.positives,
        negatives: &case.negatives,
        list_counts: &case.list_counts,
        pair_base: &case.pair_base,
        pair_counts: &case.unused,
        offsets: &case.offsets,
        out: &case.out,
    };
    kernel
        .encode(&mut rec, Pass::Emit, 2, &buffers)
        .expect("encode");
    case.assert_pair_0_stops_at_its_3_slots(rec);
}

#[test]
fn negative_buckets_emit_stays_in_its_pairs_slice() {
    let Some(ctx) = gpu_context() else {
        return;
    };
    let gpu = ctx.gpu().expect("wgpu context");
    let case = Case::new(gpu);
    let kernel = gpu.kernel::<NegativeBuckets>().expect("kernel");
    let mut rec = Recorder::new(gpu, "bounds");
    let buffers = BucketBuffers {
        params: &case.params_buckets,
        sort_params: &[],
        distances: &case.distances,
        positives: &case.positives,
        negatives: &case.negatives,
        list_counts: &case.list_counts,
        pair_base: &case.pair_base,
        sorted: &case.unused,
        buckets: &case.unused,
        order: &case.negatives,
        pair_counts: &case.unused,
        offsets: &case.offsets,
        out: &case.out,
        scratch: &case.scratch,
    };
    kernel
        .encode_pairs(&mut rec, PairPass::Emit, 2, &buffers)
        .expect("encode");
    case.assert_pair_0_stops_at_its_3_slots(rec);
}
