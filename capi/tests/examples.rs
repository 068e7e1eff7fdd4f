//! The C API as its users see it: examples/speak.c and examples/stream.cpp
//! and the error-path program tests/c/errors.c, compiled with the system's
//! cc and c++ against include/tts.h and libtts.so, run on the tiny
//! Supertonic fixture; the error paths also under valgrind's memcheck.
//!
//! The plugins come from the build tree (target/debug): build them first
//! (`cargo build -p tts-backend-cpu -p tts-model-supertonic`, or the workspace).

use engine_core::engine::Engine;
use engine_core::profile::Profile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TEXT: &str = "Hello from C. This is a second sentence.";

/// target/debug: where libtts.so and the plugins are built.
fn artifacts() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A hard link where the file system allows one (no copy of a large library), else a copy.
fn place(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e} (build the plugins first: see this file's header)", from.display()));
    }
}

/// The bundle's layout in `dir`: `lib/` with libtts.so and the ggml
/// libraries, `plugins/` with the CPU backend and the Supertonic model
/// plugin (which find `lib/` through their run path, `$ORIGIN/../lib`).
/// Returns the plugin directory.
fn plugins_in(dir: &Path) -> PathBuf {
    let (plugins, lib) = (dir.join("plugins"), dir.join("lib"));
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    for file in ["libtts_backend_cpu.so", "libggml-cpu.so", "libggml-cpu.so.stamp.json", "libtts_model_supertonic.so"] {
        place(&artifacts().join(file), &plugins.join(file));
    }
    for file in ["libggml-base.so.0", "libggml.so.0"] {
        place(&artifacts().join(file), &lib.join(file));
    }
    // The library cargo built for this test run: a test's dependencies are
    // left in deps/, beside the test, not copied up to target/debug.
    let deps = std::env::current_exe().unwrap().parent().unwrap().join("libtts.so");
    place(&deps, &lib.join("libtts.so"));
    plugins
}

/// A profile on the CPU backend with the tiny Supertonic fixture.
fn profile_in(dir: &Path) -> PathBuf {
    let model = crate_dir().parent().unwrap().join("tests/fixtures/supertonic/tiny-v2/model.gguf");
    let path = dir.join("profile.toml");
    let text = format!("[backend]\nprefer = [\"cpu\"]\nfallback = false\n[backends.cpu]\nthreads = 1\n[model]\nfiles = [\"{}\"]\n", model.display());
    std::fs::write(&path, text).unwrap();
    path
}

/// Compiles `source` (C or C++ by its extension) against include/tts.h and
/// the libtts.so in `lib`, found at run time through the run path.
fn compile(source: &str, lib: &Path, out_dir: &Path) -> PathBuf {
    let source = crate_dir().join(source);
    let cpp = source.extension().is_some_and(|e| e == "cpp");
    let out = out_dir.join(source.file_stem().unwrap());
    let mut cmd = Command::new(if cpp { "c++" } else { "cc" });
    cmd.arg(if cpp { "-std=c++17" } else { "-std=c11" })
        .args(["-Wall", "-Wextra", "-Werror", "-g"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(&source)
        .arg("-L")
        .arg(lib)
        .arg("-ltts")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out);
    // stream.cpp and errors.c synthesize on a second thread.
    cmd.arg("-pthread");
    let o = cmd.output().unwrap_or_else(|e| panic!("cc/c++: {e}"));
    assert!(o.status.success(), "compiling {}: {}", source.display(), String::from_utf8_lossy(&o.stderr));
    out
}

/// Runs `cmd`; a run still going after five minutes is killed and fails the
/// test (a hang guard for valgrind on a busy machine, not a timing check).
fn run(mut cmd: Command) -> Output {
    // The caller's environment must not choose the plugins, unless the test does.
    if !cmd.get_envs().any(|(key, _)| key == "TTS_PLUGIN_PATH") {
        cmd.env_remove("TTS_PLUGIN_PATH");
    }
    // Nothing of the build tree's library path (cargo's LD_LIBRARY_PATH):
    // what loads is found through run paths, as in a user's process.
    cmd.env_remove("LD_LIBRARY_PATH").env_remove("TTS_LOG").stdout(Stdio::piped()).stderr(Stdio::piped());
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap();
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after five minutes (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

fn text_of(o: &Output) -> String {
    format!("status {}\nstdout:\n{}\nstderr:\n{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The engine's own audio for `TEXT`, in process: the one-shot samples and
/// the streamed pieces joined.
fn engine_audio(profile: &Path, plugins: &Path) -> (Vec<f32>, Vec<f32>) {
    let engine = Engine::open(Profile::load(profile).unwrap(), vec![plugins.to_path_buf()]).unwrap();
    let mut session = engine.open_model(&[]).unwrap();
    let one_shot = session.synthesize(TEXT).unwrap().samples.to_vec();
    let mut streamed = Vec::new();
    session
        .synthesize_streaming(TEXT, |piece, _| {
            streamed.extend_from_slice(piece);
            Ok(true)
        })
        .unwrap();
    (one_shot, streamed)
}

fn floats(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() % 4, 0, "{} holds whole floats", path.display());
    bytes.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn speak_c_writes_the_engines_one_shot_samples() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_in(dir.path());
    let profile = profile_in(dir.path());
    let speak = compile("examples/speak.c", &dir.path().join("lib"), dir.path());
    let out = dir.path().join("speech.f32");
    let mut cmd = Command::new(&speak);
    cmd.arg(&profile).arg(TEXT).arg(&out).arg(&plugins);
    let o = run(cmd);
    let shown = text_of(&o);
    assert!(o.status.success(), "{shown}");
    assert!(shown.contains("model: supertonic "), "{shown}");
    assert!(shown.contains("the caller's buffer holds the same"), "{shown}");
    let (one_shot, _) = engine_audio(&profile, &plugins);
    let written = floats(&out);
    assert!(!written.is_empty());
    assert!(
        written.iter().zip(&one_shot).all(|(a, b)| a.to_bits() == b.to_bits()) && written.len() == one_shot.len(),
        "speak.c's samples differ from the engine's one-shot synthesis"
    );
}

#[test]
fn stream_cpp_streams_the_engines_pieces_and_cancels_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_in(dir.path());
    let profile = profile_in(dir.path());
    let stream = compile("examples/stream.cpp", &dir.path().join("lib"), dir.path());
    let out = dir.path().join("stream.f32");
    let mut cmd = Command::new(&stream);
    cmd.arg(&profile).arg(TEXT).arg(&out).arg(&plugins);
    let o = run(cmd);
    let shown = text_of(&o);
    assert!(o.status.success(), "{shown}");
    assert!(shown.contains("callback stop: status 5 after 1 piece(s): the synthesis was cancelled by the audio callback"), "{shown}");
    assert!(shown.contains("cancel from another thread: status 5: the synthesis was cancelled by tts_engine_cancel or tts_engine_free"), "{shown}");
    let (_, streamed) = engine_audio(&profile, &plugins);
    let written = floats(&out);
    assert!(!written.is_empty());
    assert!(
        written.len() == streamed.len() && written.iter().zip(&streamed).all(|(a, b)| a.to_bits() == b.to_bits()),
        "stream.cpp's samples differ from the engine's streamed pieces"
    );
}

#[test]
fn every_error_path_from_c_gives_its_status_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_in(dir.path());
    let profile = profile_in(dir.path());
    let errors = compile("tests/c/errors.c", &dir.path().join("lib"), dir.path());
    let mut cmd = Command::new(&errors);
    cmd.arg(&profile).arg(&plugins);
    let o = run(cmd);
    let shown = text_of(&o);
    assert!(o.status.success() && shown.contains("\n0 failed\n") && !shown.contains("FAILED"), "{shown}");
}

/// Whether `tool` runs; when it does not, the test is skipped unless CI
/// (xtask, `TTS_REQUIRE_VALGRIND`) says it is installed.
fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !found {
        assert!(std::env::var_os("TTS_REQUIRE_VALGRIND").is_none(), "TTS_REQUIRE_VALGRIND is set but {tool} does not run");
        eprintln!("skipped: {tool} is not installed");
    }
    found
}

/// The CPU module `cargo xtask module-kit cpu` builds (at ggml's default
/// ISA level; `cargo xtask test` builds it for its bundle check): the build
/// tree's module is built for this machine's ISA, which may hold AVX-512
/// that valgrind cannot run (ggml then scores the module 0).
fn kit_cpu_module() -> Option<PathBuf> {
    let out = artifacts().parent()?.join("module-kit/cpu/out");
    if out.join("libggml-cpu.so").is_file() {
        return Some(out);
    }
    assert!(std::env::var_os("TTS_REQUIRE_VALGRIND").is_none(), "TTS_REQUIRE_VALGRIND is set but {} has no libggml-cpu.so", out.display());
    eprintln!("skipped: no CPU module valgrind can run at {}: run `cargo xtask module-kit cpu` and its build.sh", out.display());
    None
}

#[test]
fn the_error_paths_read_write_and_free_nothing_wrong_under_valgrind() {
    if !have("valgrind") {
        return;
    }
    let Some(kit) = kit_cpu_module() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_in(dir.path());
    for file in ["libggml-cpu.so", "libggml-cpu.so.stamp.json"] {
        std::fs::remove_file(plugins.join(file)).unwrap();
        std::fs::copy(kit.join(file), plugins.join(file)).unwrap();
    }
    let profile = profile_in(dir.path());
    let errors = compile("tests/c/errors.c", &dir.path().join("lib"), dir.path());
    let mut cmd = Command::new("valgrind");
    // Definite leaks and every memory error fail (exit 99); what the
    // registries and the loaded plugins keep until exit is reachable, not
    // lost. The suppressions are the dynamic loader's and abi_stable's own.
    cmd.args(["--tool=memcheck", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite"])
        .arg(format!("--suppressions={}", crate_dir().join("tests/valgrind.supp").display()))
        .arg(&errors)
        .arg(&profile)
        .arg(&plugins);
    let o = run(cmd);
    let shown = text_of(&o);
    assert!(o.status.success() && shown.contains("\n0 failed\n"), "{shown}");
    assert!(shown.contains("ERROR SUMMARY: 0 errors"), "{shown}");
}

#[test]
fn libtts_in_a_bundle_finds_the_plugins_beside_its_directory() {
    // The bundle's layout: lib/libtts.so (with libggml-base) and plugins/,
    // no plugin directory passed and TTS_PLUGIN_PATH unset.
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    plugins_in(&bundle);
    let lib = bundle.join("lib");
    let profile = profile_in(dir.path());
    let speak = compile("examples/speak.c", &lib, dir.path());
    let out = dir.path().join("speech.f32");
    let mut cmd = Command::new(&speak);
    cmd.arg(&profile).arg(TEXT).arg(&out);
    let o = run(cmd);
    assert!(o.status.success() && !floats(&out).is_empty(), "{}", text_of(&o));

    // TTS_PLUGIN_PATH comes before the bundle's own: a directory without
    // plugins there is what is searched, and the error names it.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let mut cmd = Command::new(&speak);
    cmd.arg(&profile).arg(TEXT).arg(&out);
    cmd.env("TTS_PLUGIN_PATH", &empty);
    let o = run(cmd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", text_of(&o));
    assert!(err.contains("speak: opening the engine:") && err.contains(&format!("no plugin file libtts_backend_cpu.so in {}", empty.display())), "{err}");
}
