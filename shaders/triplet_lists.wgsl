// For every anchor of a chunk, the ascending lists of its positive and negative references.
//
//   positives[a * refs + i] = i-th ref r (ascending) with ref_labels[r] == anchor_labels[a]
//                             and r != self_slots[a]
//   negatives[a * refs + j] = j-th ref r (ascending) with ref_labels[r] != anchor_labels[a]
//   list_counts[2a] = number of positives, list_counts[2a + 1] = number of negatives
//
// One workgroup per anchor (y folded into x past 65 535). Each of its WORKGROUP_SIZE (64, set
// from Rust) invocations owns a contiguous segment of the references: it counts its segment's
// positives and negatives, one workgroup scan of those counts gives every segment its first
// slot, and each invocation
// then writes its segment in order. Lists therefore come out ascending (which keeps the final
// triplets in PML's lexicographic (a, p, n) order) with a fixed number of barriers per anchor,
// whatever the number of references.

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

// Invocations per workgroup: set from Rust (triplet_lists::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

var<workgroup> scan_pos: array<u32, WORKGROUP_SIZE>;
var<workgroup> scan_neg: array<u32, WORKGROUP_SIZE>;

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
    let label = anchor_labels[a];
    let me = self_slots[a];
    let row = a * params.refs;
    let segment = (params.refs + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
    let begin = min(t * segment, params.refs);
    let end = min(begin + segment, params.refs);

    var n_pos = 0u;
    var n_neg = 0u;
    for (var r = begin; r < end; r++) {
        let other = ref_labels[r];
        if (other != label) {
            n_neg += 1u;
        } else if (r != me) {
            n_pos += 1u;
        }
    }
    scan_pos[t] = n_pos;
    scan_neg[t] = n_neg;
    workgroupBarrier();
    // Hillis-Steele inclusive scan over the WORKGROUP_SIZE segment counts.
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
    var slot_pos = row + scan_pos[t] - n_pos;
    var slot_neg = row + scan_neg[t] - n_neg;
    for (var r = begin; r < end; r++) {
        let other = ref_labels[r];
        if (other != label) {
            negatives[slot_neg] = r;
            slot_neg += 1u;
        } else if (r != me) {
            positives[slot_pos] = r;
            slot_pos += 1u;
        }
    }
    if (t == WORKGROUP_SIZE - 1u) {
        list_counts[2u * a] = scan_pos[t];
        list_counts[2u * a + 1u] = scan_neg[t];
    }
}
