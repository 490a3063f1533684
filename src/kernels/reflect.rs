//! Every shader, reflected with naga after its `override`s are set from its wrapper's spec,
//! against that spec: entry points, workgroup sizes, workgroup memory, bindings (number, kind
//! and access, element size) and the uniform block's layout. A shader edited without its
//! wrapper (or the reverse) fails here, on any machine.

use std::collections::{BTreeMap, BTreeSet};

use naga::back::pipeline_constants::process_overrides;
use naga::back::PipelineConstants;
use naga::valid::{Capabilities, ValidationFlags, Validator};
use naga::valid::{FunctionInfo, ModuleInfo};
use naga::{
    AddressSpace, Block, Expression, Literal, ShaderStage, Statement, StorageAccess, TypeInner,
};

use super::{common, Binding, Spec, SPECS, WGSL_KERNELS};

/// The differences between `spec` and its shader `source` (the spec's own source, or an
/// edited copy), each as one line; empty when they agree.
fn mismatches(spec: &Spec, source: &str) -> Vec<String> {
    let stem = spec.kernel.stem;
    let mut found = Vec::new();
    let module = match naga::front::wgsl::parse_str(source) {
        Ok(m) => m,
        Err(e) => {
            return vec![format!(
                "{stem}: does not parse: {}",
                e.emit_to_string(source)
            )]
        }
    };
    let info = match Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module)
    {
        Ok(i) => i,
        Err(e) => {
            return vec![format!(
                "{stem}: does not validate: {}",
                e.emit_to_string(source)
            )]
        }
    };
    // Every override without a default is set from Rust, and nothing else is.
    let required: BTreeSet<&str> = module
        .overrides
        .iter()
        .filter(|(_, o)| o.init.is_none())
        .filter_map(|(_, o)| o.name.as_deref())
        .collect();
    let given: BTreeSet<&str> = spec.kernel.constants.iter().map(|c| c.0).collect();
    if required != given {
        found.push(format!(
            "{stem}: overrides without a default {required:?}, constants set from Rust {given:?}"
        ));
    }
    let constants: PipelineConstants = spec
        .kernel
        .constants
        .iter()
        .map(|&(name, value)| (name.to_string(), value))
        .collect();
    let names: BTreeSet<&str> = module
        .entry_points
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let declared: BTreeSet<&str> = spec.entries.iter().map(|e| e.name).collect();
    if names != declared {
        found.push(format!("{stem}: entry points {names:?}, spec {declared:?}"));
    }
    for entry in spec.entries {
        let name = entry.name;
        let Some(index) = module.entry_points.iter().position(|e| e.name == name) else {
            continue;
        };
        let (module, info) = match process_overrides(
            &module,
            &info,
            Some((ShaderStage::Compute, name)),
            &constants,
        ) {
            Ok(m) => m,
            Err(e) => {
                found.push(format!("{stem}::{name}: overrides: {e}"));
                continue;
            }
        };
        // Processing keeps only this entry point.
        let index = module
            .entry_points
            .iter()
            .position(|e| e.name == name)
            .unwrap_or(index);
        let ep = &module.entry_points[index];
        if ep.workgroup_size != entry.workgroup_size {
            found.push(format!(
                "{stem}::{name}: workgroup size {:?}, spec {:?}",
                ep.workgroup_size, entry.workgroup_size
            ));
        }
        let uses = info.get_entry_point(index);
        let mut workgroup_bytes = 0u64;
        let mut bindings = BTreeMap::new();
        for (handle, var) in module.global_variables.iter() {
            if uses[handle].is_empty() {
                continue;
            }
            let size = module.types[var.ty].inner.size(module.to_ctx());
            let element = match module.types[var.ty].inner {
                TypeInner::Array { stride, .. } => u64::from(stride),
                _ => u64::from(size),
            };
            let kind = match var.space {
                AddressSpace::WorkGroup => {
                    workgroup_bytes += u64::from(size);
                    continue;
                }
                AddressSpace::Uniform => Binding::Uniform,
                AddressSpace::Storage { access } if access.contains(StorageAccess::STORE) => {
                    Binding::ReadWrite
                }
                AddressSpace::Storage { .. } => Binding::ReadOnly,
                _ => continue,
            };
            match &var.binding {
                Some(b) if b.group == 0 => {
                    bindings.insert(b.binding, (kind, element));
                }
                other => found.push(format!("{stem}::{name}: binding {other:?} outside group 0")),
            }
        }
        if workgroup_bytes != entry.workgroup_bytes {
            found.push(format!(
                "{stem}::{name}: {workgroup_bytes} bytes of workgroup memory, spec {}",
                entry.workgroup_bytes
            ));
        }
        let expected: BTreeMap<u32, (Binding, u64)> = entry
            .bindings
            .iter()
            .map(|&(slot, kind, element)| (slot, (kind, element)))
            .collect();
        if bindings != expected {
            found.push(format!(
                "{stem}::{name}: bindings {bindings:?}, spec {expected:?}"
            ));
        }
        if entry.bindings.len() != expected.len() {
            found.push(format!(
                "{stem}::{name}: a binding is listed twice in the spec"
            ));
        }
    }
    found.extend(params_mismatches(spec, &module));
    found.extend(code_mismatches(spec, &module));
    found
}

/// The shader's `const` codes against Rust: each of the spec's own codes is declared with
/// its value, every code of `shaders/common/` a kernel composes has [`common::codes`]'s
/// value, and every `const` of a common part is in that table (none goes unchecked).
fn code_mismatches(spec: &Spec, module: &naga::Module) -> Vec<String> {
    let stem = spec.kernel.stem;
    let declared: BTreeMap<&str, Option<u32>> = module
        .constants
        .iter()
        .filter_map(|(_, c)| {
            let value = match module.global_expressions[c.init] {
                Expression::Literal(Literal::U32(v)) => Some(v),
                _ => None,
            };
            Some((c.name.as_deref()?, value))
        })
        .collect();
    let common_codes: BTreeMap<&str, u32> = common::codes().into_iter().collect();
    let mut found = Vec::new();
    for &(name, value) in spec.codes {
        if declared.get(name) != Some(&Some(value)) {
            found.push(format!(
                "{stem}: const {name} is {:?} in the shader, {value} in Rust",
                declared.get(name)
            ));
        }
    }
    for (&name, &value) in &declared {
        let in_common = common::PARTS
            .iter()
            .any(|(_, text)| text.contains(&format!("const {name}:")));
        match common_codes.get(name) {
            Some(&rust) if value != Some(rust) => found.push(format!(
                "{stem}: common const {name} is {value:?} in the shader, {rust} in Rust"
            )),
            None if in_common => found.push(format!(
                "{stem}: common const {name} has no Rust value in kernels::common::codes"
            )),
            _ => {}
        }
    }
    found
}

/// The shader's `struct Params` against the wrapper's `#[repr(C)]` uniform block: size and
/// every non-padding field at the same offset.
fn params_mismatches(spec: &Spec, module: &naga::Module) -> Vec<String> {
    let stem = spec.kernel.stem;
    let Some((members, span)) = module.types.iter().find_map(|(_, t)| match &t.inner {
        TypeInner::Struct { members, span } if t.name.as_deref() == Some("Params") => {
            Some((members, *span))
        }
        _ => None,
    }) else {
        return vec![format!("{stem}: no struct Params")];
    };
    let mut found = Vec::new();
    if span as usize != spec.params.size {
        found.push(format!(
            "{stem}: Params is {span} bytes, the Rust block {}",
            spec.params.size
        ));
    }
    let padding = |name: &str| name.starts_with('_');
    let shader: BTreeMap<&str, usize> = members
        .iter()
        .filter_map(|m| Some((m.name.as_deref()?, m.offset as usize)))
        .filter(|(name, _)| !padding(name))
        .collect();
    let rust: BTreeMap<&str, usize> = spec
        .params
        .fields
        .iter()
        .copied()
        .filter(|(name, _)| !padding(name))
        .collect();
    if shader != rust {
        found.push(format!(
            "{stem}: Params fields (name: offset) {shader:?}, the Rust block {rust:?}"
        ));
    }
    found
}

/// Stores through a pointer to one component of a vector (or one column of a matrix) in
/// workgroup memory, as `"function: store"` lines. WGSL lets such a store rewrite the whole
/// vector, and Apple's compiler does: invocations writing different components of one vector
/// then race, and tiles come out partly zero on Metal. Stage whole vectors instead.
fn component_stores(module: &naga::Module, info: &ModuleInfo) -> Vec<String> {
    fn visit(
        block: &Block,
        f: &FunctionInfo,
        module: &naga::Module,
        name: &str,
        out: &mut Vec<String>,
    ) {
        for statement in block.iter() {
            match statement {
                Statement::Store { pointer, .. } => {
                    let ty = f[*pointer].ty.inner_with(&module.types);
                    if let TypeInner::ValuePointer {
                        space: AddressSpace::WorkGroup,
                        ..
                    } = ty
                    {
                        out.push(format!(
                            "{name}: a store to one component of a workgroup vector"
                        ));
                    }
                }
                Statement::Block(b) => visit(b, f, module, name, out),
                Statement::If { accept, reject, .. } => {
                    visit(accept, f, module, name, out);
                    visit(reject, f, module, name, out);
                }
                Statement::Switch { cases, .. } => {
                    for case in cases {
                        visit(&case.body, f, module, name, out);
                    }
                }
                Statement::Loop {
                    body, continuing, ..
                } => {
                    visit(body, f, module, name, out);
                    visit(continuing, f, module, name, out);
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for (handle, function) in module.functions.iter() {
        let name = function.name.as_deref().unwrap_or("?");
        visit(&function.body, &info[handle], module, name, &mut out);
    }
    for (i, ep) in module.entry_points.iter().enumerate() {
        visit(
            &ep.function.body,
            info.get_entry_point(i),
            module,
            &ep.name,
            &mut out,
        );
    }
    out
}

/// The shipped kernels' specs and every generated GEMM variant's.
fn all_specs() -> Vec<&'static Spec> {
    SPECS
        .iter()
        .copied()
        .chain(
            super::gemm_tile::GEMM_CANDIDATES
                .iter()
                .map(|&v| super::gemm_tile::spec(v)),
        )
        .collect()
}

#[test]
fn no_shader_stores_one_component_of_a_workgroup_vector() {
    for spec in all_specs() {
        let source = spec.kernel.source;
        let module = naga::front::wgsl::parse_str(source).expect("parses");
        let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
            .validate(&module)
            .expect("validates");
        let found = component_stores(&module, &info);
        assert!(found.is_empty(), "{}: {found:?}", spec.kernel.stem);
    }
}

#[test]
fn a_component_store_to_a_workgroup_vector_is_found() {
    let shader = |store: &str| {
        format!(
            "var<workgroup> slab: array<vec4<f32>, 4>;\n\
             var<private> own: vec4<f32>;\n\
             @compute @workgroup_size(4)\n\
             fn main(@builtin(local_invocation_index) i: u32) {{\n    {store}\n}}\n"
        )
    };
    let stores = |store: &str| {
        let source = shader(store);
        let module = naga::front::wgsl::parse_str(&source).expect("parses");
        let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
            .validate(&module)
            .expect("validates");
        component_stores(&module, &info).len()
    };
    assert_eq!(
        stores("slab[0][i] = 1.0;"),
        1,
        "one lane of a shared vector"
    );
    assert_eq!(
        stores("if (i == 0u) { slab[1].y = 1.0; }"),
        1,
        "a swizzle, nested"
    );
    assert_eq!(stores("slab[i] = vec4<f32>(1.0);"), 0, "a whole vector");
    assert_eq!(
        stores("own[i] = 1.0;"),
        0,
        "a component of a private vector"
    );
}

#[test]
fn every_shader_matches_its_wrapper_spec() {
    assert_eq!(
        SPECS.len(),
        WGSL_KERNELS.len(),
        "one spec per shipped kernel"
    );
    let mut all = Vec::new();
    for spec in all_specs() {
        all.extend(mismatches(spec, spec.kernel.source));
    }
    assert!(
        all.is_empty(),
        "shaders and wrappers disagree:\n{}",
        all.join("\n")
    );
}

/// Edits of one shader that its wrapper does not know about: each must be caught.
#[test]
fn a_shader_edited_without_its_wrapper_is_caught() {
    let tile = SPECS
        .iter()
        .find(|s| s.kernel.stem == "distance_tile")
        .expect("distance_tile is shipped");
    let select = SPECS
        .iter()
        .find(|s| s.kernel.stem == "knn_select")
        .expect("knn_select is shipped");
    let pairs = SPECS
        .iter()
        .find(|s| s.kernel.stem == "pair_select")
        .expect("pair_select is shipped");
    let edits: [(&Spec, &str, &str); 8] = [
        // A metric code of the common part changed in a kernel's composed source.
        (
            tile,
            "const METRIC_COSINE: u32 = 2u;",
            "const METRIC_COSINE: u32 = 5u;",
        ),
        // A kernel's own code changed.
        (
            pairs,
            "const EASY_HARD: u32 = 3u;",
            "const EASY_HARD: u32 = 4u;",
        ),
        // A fixed workgroup size instead of the one set from Rust.
        (
            tile,
            "@workgroup_size(THREADS, THREADS, 1)",
            "@workgroup_size(8, 8, 1)",
        ),
        // A binding moved.
        (
            tile,
            "@binding(5) var<storage, read_write> out",
            "@binding(6) var<storage, read_write> out",
        ),
        // Read-only where the wrapper binds read-write.
        (
            select,
            "var<storage, read_write> best_out",
            "var<storage, read> best_out",
        ),
        // One more word of selection state in workgroup memory (used, so that it counts).
        (
            select,
            "        mask = 0u;\n",
            "        mask = 0u;\n        extra = 0u;\n",
        ),
        // A uniform field reordered.
        (
            tile,
            "    rows: u32,\n    cols: u32,",
            "    cols: u32,\n    rows: u32,",
        ),
        // A tunable hard-coded in the shader.
        (
            select,
            "override WORKGROUP_SIZE: u32;",
            "const WORKGROUP_SIZE: u32 = 64u;",
        ),
    ];
    for (spec, from, to) in edits {
        assert!(
            spec.kernel.source.contains(from),
            "{}: {from:?} is in the shader",
            spec.kernel.stem
        );
        let mut edited = spec.kernel.source.replacen(from, to, 1);
        if to.contains("extra") {
            edited = edited.replacen(
                "var<workgroup> mask: u32;",
                "var<workgroup> mask: u32;\nvar<workgroup> extra: u32;",
                1,
            );
        }
        let found = mismatches(spec, &edited);
        assert!(
            !found.is_empty(),
            "{}: editing {from:?} into {to:?} went unnoticed",
            spec.kernel.stem
        );
    }
}
