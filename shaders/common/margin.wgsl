// common/margin.wgsl: PML TripletMarginMiner's rule, the one copy every triplet kernel uses
// (Rust's is `TripletRule::keeps`; the property tests compare them). The codes of `mode` are
// checked against Rust's `TripletRule::mode` by reflection.

const RULE_ALL_VALID: u32 = 0u;
const RULE_ALL: u32 = 1u;
const RULE_HARD: u32 = 2u;
const RULE_SEMIHARD: u32 = 3u;
const RULE_EASY: u32 = 4u;

// tm = an - ap for distances, ap - an for similarities (`inverted`).
fn triplet_margin(ap: f32, an: f32, inverted: bool) -> f32 {
    return select(an - ap, ap - an, inverted);
}

// Whether the rule `mode` with `margin` keeps the triplet with values `ap` and `an`.
fn keeps(mode: u32, margin: f32, ap: f32, an: f32, inverted: bool) -> bool {
    let tm = triplet_margin(ap, an, inverted);
    switch mode {
        case RULE_ALL: {
            return tm <= margin;
        }
        case RULE_HARD: {
            return tm <= margin && tm <= 0.0;
        }
        case RULE_SEMIHARD: {
            return tm <= margin && tm > 0.0;
        }
        case RULE_EASY: {
            return tm > margin;
        }
        default: {
            return true;
        }
    }
}
