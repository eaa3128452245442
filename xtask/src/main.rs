//! `cargo xtask demo`: the README's first command: the portal's wasm and the optimised server built at once, then
//! `tessera serve --demo`.
//!
//! `cargo xtask site`: builds `tessera-frontend` for `wasm32-unknown-unknown` with the `hydrate` feature (profile
//! `wasm-release`: size-optimised) and binds it with wasm-bindgen into `target/site/pkg` (`tessera.js`,
//! `tessera_bg.wasm`), where `tessera serve` reads it at start. `--dev` builds the wasm unoptimised (faster,
//! larger). The wasm is built in a target folder of its own (`target/site-build`), so that it can be built while a
//! cargo build of the server runs in `target` (two cargo builds in one folder wait for each other).
//!
//! The binding is done by `wasm-bindgen-cli-support` pinned to the same version as the frontend's `wasm-bindgen`,
//! so nothing is installed or downloaded. Release builds are then shrunk with `wasm-opt -Oz` from the npm package
//! `binaryen` (pinned in `xtask/package.json` and installed by this command with `npm ci --prefix xtask` when npm
//! is there and it is not); without it the site works the same, larger (the name section is removed either way).
//! Debian's `binaryen` is never used: its older `wasm-opt` breaks hydration.
//!
//! The `wasm32-unknown-unknown` target is added with rustup when it is missing (`rust-toolchain.toml` names it,
//! but rustup installs a toolchain file's targets only along with a toolchain it installs, not into one it has).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Adds the wasm32 target with rustup when the active toolchain lacks it (and says why a build would fail when
/// there is no rustup to add it with).
fn ensure_wasm_target(root: &Path) -> Result<(), String> {
    const TARGET: &str = "wasm32-unknown-unknown";
    let sysroot = Command::new("rustc").current_dir(root).args(["--print", "sysroot"]).output();
    let has_target = match &sysroot {
        Ok(o) if o.status.success() => {
            let sysroot = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            sysroot.join("lib").join("rustlib").join(TARGET).exists()
        }
        _ => false,
    };
    if has_target {
        return Ok(());
    }
    eprintln!("xtask: adding the {TARGET} target (rustup target add {TARGET}), once");
    match Command::new("rustup").current_dir(root).args(["target", "add", TARGET]).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("rustup target add {TARGET} failed ({s})")),
        Err(e) => {
            Err(format!("the {TARGET} target is missing and rustup cannot add it ({e}): install it for your toolchain"))
        }
    }
}

fn site(dev: bool, locked: bool) -> Result<PathBuf, String> {
    let root = workspace_root();
    ensure_wasm_target(&root)?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let profile = if dev { "dev" } else { "wasm-release" };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    // binaryen from the npm registry, fetched while the wasm builds.
    let binaryen = if dev || wasm_opt(&root).exists() { None } else { install_binaryen(&root) };
    let build_dir = target_dir.join("site-build");
    let mut build = Command::new(cargo);
    build
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &build_dir)
        // The crate is an rlib for the server's rendering; only this build makes the wasm library of it (a
        // `cdylib` in Cargo.toml made every native build link a shared library nobody loads, and kept the crates
        // that use it from starting before it was done).
        .args([
            "rustc",
            "-p",
            "tessera-frontend",
            "--lib",
            "--crate-type",
            "cdylib",
            "--target",
            "wasm32-unknown-unknown",
        ])
        .args(["--no-default-features", "--features", "hydrate", "--profile", profile]);
    if locked {
        build.arg("--locked");
    }
    let status = build.status().map_err(|e| format!("cargo: {e}"));
    if let Some(mut npm) = binaryen {
        match npm.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("xtask: npm ci --prefix xtask failed ({s}): the wasm is not shrunk"),
            Err(e) => eprintln!("xtask: npm ci --prefix xtask: {e}"),
        }
    }
    let status = status?;
    if !status.success() {
        return Err(format!("building the frontend for wasm32 failed ({status})"));
    }
    let dir = if dev { "debug" } else { profile };
    let wasm = build_dir.join("wasm32-unknown-unknown").join(dir).join("tessera_frontend.wasm");
    let out = target_dir.join("site").join("pkg");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    // Binding and shrinking take minutes; when the wasm cargo left is the one the site was made from, the site is
    // left as it is.
    let stamp = out.join(".built-from");
    let from = built_from(&root, &wasm, dev)?;
    let made = ["tessera.js", "tessera_bg.wasm"].iter().all(|f| out.join(f).exists());
    if made && std::fs::read_to_string(&stamp).is_ok_and(|s| s == from) {
        eprintln!("xtask: the portal site is up to date with {}", wasm.display());
        return Ok(out);
    }
    let _ = std::fs::remove_file(&stamp);
    wasm_bindgen_cli_support::Bindgen::new()
        .input_path(&wasm)
        .out_name("tessera")
        .web(true)
        .map_err(|e| e.to_string())?
        .debug(dev)
        // The function names are most of an unshrunk release wasm's size; wasm-opt drops them too.
        .remove_name_section(!dev)
        .generate(&out)
        .map_err(|e| format!("wasm-bindgen on {}: {e}", wasm.display()))?;
    for name in ["tessera.js", "tessera_bg.wasm"] {
        for suffix in [".br", ".gz"] {
            let _ = std::fs::remove_file(out.join(format!("{name}{suffix}")));
        }
    }
    if !dev {
        shrink(&root, &out.join("tessera_bg.wasm"))?;
        for name in ["tessera.js", "tessera_bg.wasm"] {
            precompress(&out.join(name))?;
        }
    }
    // Whether the views were erased (this program is compiled with the flags the wasm build inherits): the server
    // refuses a browser half whose view tree would not match its own (see `.cargo/config.toml`).
    let views = out.join(VIEWS_FILE);
    std::fs::write(&views, views_kind()).map_err(|e| format!("{}: {e}", views.display()))?;
    std::fs::write(&stamp, from).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(out)
}

/// The file in the site's folder that says how its views were compiled (read by `tessera_portal::Site::load`).
const VIEWS_FILE: &str = "views";

/// `erased` when Leptos's `erase_components` was set for this build, else `typed`.
fn views_kind() -> &'static str {
    if cfg!(erase_components) { "erased\n" } else { "typed\n" }
}

/// What the site is made from: the profile, whether `wasm-opt` is there to shrink it, and the size and modification
/// time of the wasm cargo built.
fn built_from(root: &Path, wasm: &Path, dev: bool) -> Result<String, String> {
    let meta = std::fs::metadata(wasm).map_err(|e| format!("{}: {e}", wasm.display()))?;
    let modified =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    let how = match (dev, wasm_opt(root).exists()) {
        (true, _) => "dev",
        (false, true) => "release shrunk",
        (false, false) => "release",
    };
    Ok(format!("{how} {} {} {modified}\n", views_kind().trim_end(), meta.len()))
}

/// npm's `wasm-opt` (binaryen) in `xtask/node_modules`.
fn wasm_opt(root: &Path) -> PathBuf {
    root.join("xtask").join("node_modules").join(".bin").join("wasm-opt")
}

/// Starts `npm ci --prefix xtask` (binaryen's `wasm-opt`, pinned by `xtask/package-lock.json`), or says why the
/// wasm will not be shrunk when npm is not there.
fn install_binaryen(root: &Path) -> Option<std::process::Child> {
    eprintln!("xtask: installing binaryen's wasm-opt from the npm registry (npm ci --prefix xtask), once");
    let npm = Command::new("npm")
        .current_dir(root)
        .args(["ci", "--prefix", "xtask", "--no-audit", "--no-fund", "--loglevel", "error"])
        .stdout(std::process::Stdio::null())
        .spawn();
    match npm {
        Ok(child) => Some(child),
        Err(e) => {
            eprintln!("xtask: npm: {e}: the wasm is not shrunk (Node.js and npm install it)");
            None
        }
    }
}

/// `wasm-opt -Oz` in place, with npm's binaryen from `xtask/node_modules` when it is there.
fn shrink(root: &Path, wasm: &Path) -> Result<(), String> {
    let tool = wasm_opt(root);
    if !tool.exists() {
        eprintln!("xtask: {} not installed (npm ci --prefix xtask): the wasm is not shrunk", tool.display());
        return Ok(());
    }
    let before = std::fs::metadata(wasm).map(|m| m.len()).unwrap_or(0);
    let tmp = wasm.with_extension("opt.wasm");
    let status = Command::new(&tool)
        .arg("-Oz")
        .arg(wasm)
        .arg("-o")
        .arg(&tmp)
        .status()
        .map_err(|e| format!("{}: {e}", tool.display()))?;
    if !status.success() {
        return Err(format!("wasm-opt failed ({status})"));
    }
    std::fs::rename(&tmp, wasm).map_err(|e| format!("{}: {e}", wasm.display()))?;
    let after = std::fs::metadata(wasm).map(|m| m.len()).unwrap_or(0);
    eprintln!("xtask: wasm-opt -Oz: {} KiB -> {} KiB", before / 1024, after / 1024);
    Ok(())
}

/// Writes `FILE.br` and `FILE.gz` beside `file`, each at its format's highest level: the server sends them as they
/// are to browsers that accept them (`tessera_portal::Site`), rather than compressing the wasm on every request.
fn precompress(file: &Path) -> Result<(), String> {
    use std::io::Write;
    let plain = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let started = std::time::Instant::now();
    let br = brotli_of(&plain)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&plain).map_err(|e| format!("gzip: {e}"))?;
    let gz = gz.finish().map_err(|e| format!("gzip: {e}"))?;
    for (suffix, bytes) in [("br", &br), ("gz", &gz)] {
        let path = PathBuf::from(format!("{}.{suffix}", file.display()));
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!(
        "xtask: {}: {} KiB, brotli {} KiB, gzip {} KiB ({} ms)",
        file.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        plain.len() / 1024,
        br.len() / 1024,
        gz.len() / 1024,
        started.elapsed().as_millis()
    );
    Ok(())
}

/// `bytes` compressed with brotli at quality 11 and a 4 MiB window.
fn brotli_of(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let params = brotli::enc::BrotliEncoderParams { quality: 11, lgwin: 22, ..Default::default() };
    let mut out = Vec::new();
    brotli::BrotliCompress(&mut &bytes[..], &mut out, &params).map_err(|e| format!("brotli: {e}"))?;
    Ok(out)
}

/// `cargo xtask demo [--locked] [-- SERVE ARGS]`: builds the portal's wasm (as `site` does) and the optimised
/// `tessera` at the same time, then runs `tessera serve --demo SERVE ARGS` in its place. The two builds use different
/// target folders, so neither waits for the other; on two cores that takes minutes off a first build, since each
/// leaves a core idle while it compiles its largest crate or links.
fn demo(locked: bool, serve_args: &[String]) -> ExitCode {
    let root = workspace_root();
    let started = std::time::Instant::now();
    let wasm = std::thread::spawn(move || site(false, locked));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Command::new(cargo);
    // `-p tessera-server`: features are resolved for the packages a command selects, and without it that is the whole
    // workspace, so the node agent's `kube` feature (the Kubernetes client, which the server does not use) came along.
    build.current_dir(&root).args(["build", "--profile", "demo", "-p", "tessera-server", "--bin", "tessera"]);
    if locked {
        build.arg("--locked");
    }
    let built = build.status();
    let wasm = wasm.join().unwrap_or_else(|_| Err("the site build stopped".to_string()));
    match built {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("xtask: building tessera failed ({s})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("xtask: cargo: {e}");
            return ExitCode::FAILURE;
        }
    }
    match wasm {
        Ok(out) => eprintln!(
            "xtask: portal site in {} and tessera (profile demo) built in {} s",
            out.display(),
            started.elapsed().as_secs()
        ),
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::FAILURE;
        }
    }
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let mut serve = Command::new(target_dir.join("demo").join("tessera"));
    serve.arg("serve").arg("--demo").args(serve_args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = serve.exec();
        eprintln!("xtask: tessera: {e}");
        ExitCode::FAILURE
    }
    #[cfg(not(unix))]
    match serve.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: tessera: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => {
            let (ours, serve_args) = match args.iter().position(|a| a == "--") {
                Some(i) => (&args[1..i], &args[i + 1..]),
                None => (&args[1..], &args[args.len()..]),
            };
            if let Some(unknown) = ours.iter().find(|a| *a != "--locked") {
                eprintln!("xtask: unknown argument {unknown}; usage: cargo xtask demo [--locked] [-- SERVE ARGS]");
                return ExitCode::from(2);
            }
            demo(!ours.is_empty(), serve_args)
        }
        Some("site") => {
            let dev = args.iter().any(|a| a == "--dev");
            let locked = args.iter().any(|a| a == "--locked");
            match site(dev, locked) {
                Ok(out) => {
                    let size = std::fs::metadata(out.join("tessera_bg.wasm")).map(|m| m.len()).unwrap_or(0);
                    eprintln!("xtask: portal site in {} (tessera_bg.wasm: {} KiB)", out.display(), size / 1024);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("xtask: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: cargo xtask site [--dev] [--locked] | cargo xtask demo [--locked] [-- SERVE ARGS]");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server sends as `Content-Encoding: br` decompresses to the file it was made from.
    #[test]
    fn brotli_forms_decompress_to_the_original() {
        let original: Vec<u8> = (0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let compressed = brotli_of(&original).expect("compressed");
        assert!(compressed.len() < original.len() / 4, "{} bytes", compressed.len());
        let mut back = Vec::new();
        brotli::BrotliDecompress(&mut &compressed[..], &mut back).expect("decompressed");
        assert_eq!(back, original);
    }
}
