//! Every WGSL kernel parses, validates, and translates to SPIR-V, MSL, HLSL and GLSL (compute)
//! with its `override` constants set as the crate sets them, so Metal and DX12 breakage shows
//! up on a machine that has neither; and every file in `shaders/` is registered in
//! `WGSL_KERNELS` with its wrapper, its reference and its test module beside it.

use std::collections::BTreeSet;
use std::path::Path;

use naga::back::pipeline_constants::process_overrides;
use naga::back::{glsl, hlsl, msl, spv, PipelineConstants};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use wgpu_metric_learning::{gemm_kernels, WgslKernel, WGSL_KERNELS};

/// Every kernel the crate can build: the shipped files and the generated GEMM variants.
fn all_kernels() -> Vec<WgslKernel> {
    WGSL_KERNELS.iter().copied().chain(gemm_kernels()).collect()
}

fn parse_and_validate(stem: &str, source: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{stem}.wgsl does not parse:\n{}", e.emit_to_string(source)));
    // Only what core WebGPU gives: the kernels must not need optional capabilities.
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| {
            panic!(
                "{stem}.wgsl does not validate:\n{}",
                e.emit_to_string(source)
            )
        });
    (module, info)
}

#[test]
fn every_shader_validates_and_translates_to_all_four_languages() {
    assert!(!WGSL_KERNELS.is_empty(), "the registry lists the kernels");
    for WgslKernel {
        stem,
        source,
        constants,
    } in all_kernels()
    {
        let (module, info) = parse_and_validate(stem, source);
        let entries: Vec<String> = module
            .entry_points
            .iter()
            .filter(|e| e.stage == naga::ShaderStage::Compute)
            .map(|e| e.name.clone())
            .collect();
        assert!(!entries.is_empty(), "{stem}.wgsl has a compute entry point");
        let constants: PipelineConstants = constants
            .iter()
            .map(|&(name, value)| (name.to_string(), value))
            .collect();
        for entry in entries {
            let (module, info) = process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, &entry)),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{stem}::{entry}: overrides: {e}"));
            translate(stem, &module, &info, entry);
        }
    }
}

/// Translates one compute entry point to SPIR-V, MSL, HLSL and GLSL.
fn translate(stem: &str, module: &naga::Module, info: &naga::valid::ModuleInfo, entry: String) {
    {
        let spirv = spv::write_vec(
            module,
            info,
            &spv::Options::default(),
            Some(&spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: entry.clone(),
            }),
        )
        .unwrap_or_else(|e| panic!("{stem}: SPIR-V: {e}"));
        assert!(spirv.len() > 5, "{stem}: SPIR-V has a body");

        let (metal, _) = msl::write_string(
            module,
            info,
            &msl::Options {
                lang_version: (2, 0),
                ..Default::default()
            },
            &msl::PipelineOptions {
                entry_point: Some((naga::ShaderStage::Compute, entry.clone())),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{stem}: MSL: {e}"));
        assert!(
            metal.contains("kernel"),
            "{stem}: MSL has a kernel function"
        );

        let mut hlsl_out = String::new();
        let hlsl_options = hlsl::Options {
            shader_model: hlsl::ShaderModel::V5_1,
            ..Default::default()
        };
        let hlsl_pipeline = hlsl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, entry.clone())),
        };
        hlsl::Writer::new(&mut hlsl_out, &hlsl_options, &hlsl_pipeline)
            .write(module, info, None)
            .unwrap_or_else(|e| panic!("{stem}: HLSL: {e}"));
        assert!(
            hlsl_out.contains("numthreads"),
            "{stem}: HLSL has a compute entry"
        );

        let mut glsl_out = String::new();
        let glsl_options = glsl::Options {
            version: glsl::Version::new_gles(310),
            ..Default::default()
        };
        let glsl_pipeline = glsl::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: entry.clone(),
            multiview: None,
        };
        glsl::Writer::new(
            &mut glsl_out,
            module,
            info,
            &glsl_options,
            &glsl_pipeline,
            naga::proc::BoundsCheckPolicies::default(),
        )
        .and_then(|mut w| w.write())
        .unwrap_or_else(|e| panic!("{stem}: GLSL: {e}"));
        assert!(
            glsl_out.contains("local_size_x"),
            "{stem}: GLSL has a compute layout"
        );
    }
}

fn stems_in(dir: &str, ext: &str) -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == ext).then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect()
}

#[test]
fn every_stem_has_its_four_files() {
    let files = stems_in("shaders", "wgsl");
    let registered: BTreeSet<String> = all_kernels().iter().map(|k| k.stem.to_string()).collect();
    assert_eq!(
        files, registered,
        "shaders/*.wgsl and WGSL_KERNELS (with the generated gemm_tile) must list the same kernels"
    );
    let wrappers = stems_in("src/kernels", "rs");
    let references = stems_in("src/reference", "rs");
    let tests = stems_in("tests/kernels", "rs");
    let root =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernels/mod.rs"))
            .expect("tests/kernels/mod.rs");
    for stem in &files {
        assert!(wrappers.contains(stem), "src/kernels/{stem}.rs is missing");
        assert!(
            references.contains(stem),
            "src/reference/{stem}.rs is missing"
        );
        assert!(tests.contains(stem), "tests/kernels/{stem}.rs is missing");
        assert!(
            root.contains(&format!("mod {stem};")),
            "tests/kernels/mod.rs does not declare mod {stem}"
        );
    }
}

/// `shaders/common/*.wgsl` by name, with their text.
fn common_parts() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders/common");
    stems_in("shaders/common", "wgsl")
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(format!("{name}.wgsl")))
                .unwrap_or_else(|e| panic!("common/{name}.wgsl: {e}"));
            (name, text)
        })
        .collect()
}

/// `source` without the common parts composed in front of it, and their names in order.
fn strip_common<'a>(mut source: &'a str, parts: &[(String, String)]) -> (Vec<String>, &'a str) {
    let mut used = Vec::new();
    while let Some((name, text)) = parts
        .iter()
        .find(|(_, t)| !t.is_empty() && source.starts_with(t.as_str()))
    {
        used.push(name.clone());
        source = &source[text.len()..];
    }
    (used, source)
}

#[test]
fn registered_sources_are_the_files_on_disk() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let parts = common_parts();
    assert!(parts.len() >= 5, "shaders/common has its parts: {parts:?}");
    let mut composed = BTreeSet::new();
    for WgslKernel { stem, source, .. } in WGSL_KERNELS {
        let on_disk = std::fs::read_to_string(dir.join(format!("{stem}.wgsl")))
            .unwrap_or_else(|e| panic!("{stem}.wgsl: {e}"));
        let (used, own) = strip_common(source, &parts);
        assert_eq!(
            own, on_disk,
            "{stem}: the registry embeds common parts, then shaders/{stem}.wgsl"
        );
        composed.extend(used);
    }
    // A generated variant is the family's composed file followed by its entry point.
    let prelude = std::fs::read_to_string(dir.join("gemm_tile.wgsl")).expect("gemm_tile.wgsl");
    for k in gemm_kernels() {
        let (used, own) = strip_common(k.source, &parts);
        assert!(
            own.starts_with(&prelude),
            "a gemm_tile variant embeds common parts, then shaders/gemm_tile.wgsl"
        );
        composed.extend(used);
    }
    let all: BTreeSet<String> = parts.into_iter().map(|(name, _)| name).collect();
    assert_eq!(composed, all, "every common part is composed into a kernel");
}

/// Each top-level `fn` of a WGSL text: its name and its text after the name (parameters and
/// body) without comments and with whitespace collapsed.
fn functions(text: &str) -> Vec<(String, String)> {
    let code: Vec<&str> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if let Some(rest) = code[i].strip_prefix("fn ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let mut body = vec![&rest[name.len()..]];
            i += 1;
            while i < code.len() && !code[i].starts_with('}') {
                body.push(code[i]);
                i += 1;
            }
            let flat = body
                .join(" ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            out.push((name, flat));
        }
        i += 1;
    }
    out
}

/// Functions written twice: a common part's function defined again anywhere, or one body
/// (renamed or not) in two files.
fn copies(files: &[(String, String)], common: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut owner: std::collections::BTreeMap<String, String> = Default::default();
    for (name, text) in common {
        for (f, _) in functions(text) {
            if let Some(other) = owner.insert(f.clone(), format!("common/{name}")) {
                found.push(format!("{f} is in {other} and common/{name}"));
            }
        }
    }
    let mut bodies: std::collections::BTreeMap<String, String> = Default::default();
    for (file, text) in files.iter().chain(common) {
        for (f, body) in functions(text) {
            if let Some(home) = owner.get(&f) {
                if !home.ends_with(&format!("/{file}")) && !common.iter().any(|(n, _)| n == file) {
                    found.push(format!("{f} is in {home} and again in {file}.wgsl"));
                }
            }
            if let Some(first) = bodies.insert(body, format!("{file}::{f}")) {
                found.push(format!("{file}::{f} copies {first}"));
            }
        }
    }
    found
}

#[test]
fn no_wgsl_function_is_written_twice() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let files: Vec<(String, String)> = stems_in("shaders", "wgsl")
        .into_iter()
        .map(|stem| {
            let text = std::fs::read_to_string(dir.join(format!("{stem}.wgsl")))
                .unwrap_or_else(|e| panic!("{stem}.wgsl: {e}"));
            (stem, text)
        })
        .collect();
    let common = common_parts();
    let found = copies(&files, &common);
    assert!(
        found.is_empty(),
        "WGSL helpers written twice (share them through shaders/common/):\n{}",
        found.join("\n")
    );
    // The check finds a copy: a helper of a common part pasted into a kernel, and one
    // kernel's function pasted into another under a new name.
    let mut pasted = files.clone();
    let log1p = "fn log1p(z: f32) -> f32 {\n    return z;\n}\n";
    pasted[0].1.push_str(log1p);
    let renamed = functions(&files[1].1)
        .into_iter()
        .next()
        .map(|(_, body)| format!("fn renamed{body}\n}}\n"))
        .expect("a kernel has a function");
    pasted[2].1.push_str(&renamed);
    let found = copies(&pasted, &common);
    assert_eq!(found.len(), 2, "both pastes are found: {found:?}");
}
