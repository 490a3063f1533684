// For every anchor of a chunk, the ascending lists of its positive and negative references.
//
//   positives[a * refs + i] = i-th ref r (ascending) with ref_labels[r] == anchor_labels[a]
//                             and r != self_slots[a]
//   negatives[a * refs + j] = j-th ref r (ascending) with ref_labels[r] != anchor_labels[a]
//   list_counts[2a] = number of positives, list_counts[2a + 1] = number of negatives
//
// One workgroup per anchor walks the references 256 at a time; a workgroup-wide inclusive scan
// of the two flags gives every reference its slot, so the lists come out in index order (which
// is what keeps the final triplets in PML's lexicographic (a, p, n) order). The anchor index
// folds the y workgroup coordinate into x when there are more than 65 535 anchors.

struct Params {
    anchors: u32,
    refs: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> anchor_labels: array<u32>;
@group(0) @binding(2) var<storage, read> ref_labels: array<u32>;
// The ref slot that holds the anchor itself (never its positive), or 0xFFFFFFFF.
@group(0) @binding(3) var<storage, read> self_slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> positives: array<u32>;
@group(0) @binding(5) var<storage, read_write> negatives: array<u32>;
@group(0) @binding(6) var<storage, read_write> list_counts: array<u32>;

const WORKGROUP_SIZE: u32 = 256u;

var<workgroup> scan_pos: array<u32, 256>;
var<workgroup> scan_neg: array<u32, 256>;

@compute @workgroup_size(256, 1, 1)
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
    let label = anchor_labels[a];
    let me = self_slots[a];
    let row = a * params.refs;
    var base_pos = 0u;
    var base_neg = 0u;
    for (var r0 = 0u; r0 < params.refs; r0 += WORKGROUP_SIZE) {
        let r = r0 + t;
        var is_pos = 0u;
        var is_neg = 0u;
        if (r < params.refs) {
            let other = ref_labels[r];
            is_pos = select(0u, 1u, other == label && r != me);
            is_neg = select(0u, 1u, other != label);
        }
        scan_pos[t] = is_pos;
        scan_neg[t] = is_neg;
        workgroupBarrier();
        // Hillis-Steele inclusive scan: log2(256) = 8 steps.
        for (var offset = 1u; offset < WORKGROUP_SIZE; offset <<= 1u) {
            var add_pos = 0u;
            var add_neg = 0u;
            if (t >= offset) {
                add_pos = scan_pos[t - offset];
                add_neg = scan_neg[t - offset];
            }
            workgroupBarrier();
            scan_pos[t] += add_pos;
            scan_neg[t] += add_neg;
            workgroupBarrier();
        }
        if (is_pos == 1u) {
            positives[row + base_pos + scan_pos[t] - 1u] = r;
        }
        if (is_neg == 1u) {
            negatives[row + base_neg + scan_neg[t] - 1u] = r;
        }
        base_pos += scan_pos[WORKGROUP_SIZE - 1u];
        base_neg += scan_neg[WORKGROUP_SIZE - 1u];
        // Everyone has read the totals before the next block overwrites them.
        workgroupBarrier();
    }
    if (t == 0u) {
        list_counts[2u * a] = base_pos;
        list_counts[2u * a + 1u] = base_neg;
    }
}
