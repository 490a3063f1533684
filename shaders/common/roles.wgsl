// common/roles.wgsl: each reference's role for an anchor of the block. Expects of the kernel
// it is composed into: `params.refs` and the binding `labels` (refs reference labels, then per
// anchor its label and the slot of its own row, 0xFFFFFFFF: none).

const ROLE_NONE: u32 = 0u;
const ROLE_POSITIVE: u32 = 1u;
const ROLE_NEGATIVE: u32 = 2u;

// Reference j for anchor a: ROLE_NEGATIVE (another label), ROLE_POSITIVE (its label, not
// its own row) or ROLE_NONE (its own row).
fn role(a: u32, j: u32) -> u32 {
    let other = labels[j];
    let label = labels[params.refs + 2u * a];
    if (other != label) {
        return ROLE_NEGATIVE;
    }
    if (j == labels[params.refs + 2u * a + 1u]) {
        return ROLE_NONE;
    }
    return ROLE_POSITIVE;
}
